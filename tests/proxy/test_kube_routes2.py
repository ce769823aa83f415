"""Kubernetes writes whose request target Go's apiserver reads otherwise than Python: the
route refuses them; the same writes spelt plainly are still decided."""

from __future__ import annotations

import dataclasses

import pytest
from mitmproxy.test import tflow, tutils

from ctrlrun.proxy.addon import facts
from ctrlrun.proxy.config import Upstream
from ctrlrun.proxy.route_values import KubeWrite
from ctrlrun.proxy.routes import Invalid, PassThrough, Request, map_request
from ctrlrun.testing.kubernetes.routes import go_query

KUBE = Upstream(
    name="prod-eu",
    profile="kubernetes",
    url="https://10.0.0.1:6443",
    scheme="https",
    host="10.0.0.1",
    port=6443,
    cluster="eu-1",
)
SCALE = "/apis/apps/v1/namespaces/prod/deployments/web/scale"
MERGE = "application/merge-patch+json"
BODY = b'{"spec":{"replicas":6}}'


def flow_request(target: str, method: str = "PATCH", body: bytes = BODY) -> Request:
    """What the addon makes of a request with this exact target."""
    flow = tutils.treq(method=method.encode(), path=target.encode(), content=body)
    flow.headers["content-type"] = MERGE
    flow.headers["content-length"] = str(len(body))  # as on the wire (treq's says 7)
    return facts(tflow.tflow(req=flow))


def test_the_fake_reads_a_query_as_go_does() -> None:
    assert go_query("/x?dryRun=All") == {"dryRun": ["All"]}
    assert go_query("/x?dryRun=All#;") == {}
    assert go_query("/x?a=1#&dryRun=All") == {"a": ["1#"], "dryRun": ["All"]}
    assert go_query("/x?dryRun=All#%zz") == {}


@pytest.mark.parametrize(
    "target",
    [
        f"{SCALE}?dryRun=All#;",
        f"{SCALE}?dryRun=All#%zz",
        f"{SCALE}#?dryRun=All",
        f"{SCALE}?fieldManager=me#x",
    ],
)
def test_a_hash_in_a_writes_target_is_refused(target: str) -> None:
    request = flow_request(target)
    assert request.fragment
    result = map_request(KUBE, request)
    assert isinstance(result, Invalid), result
    assert "'#'" in result.reason


def test_the_same_writes_without_a_hash_are_decided() -> None:
    assert isinstance(map_request(KUBE, flow_request(f"{SCALE}?dryRun=All")), PassThrough)
    assert isinstance(map_request(KUBE, flow_request(f"{SCALE}?fieldManager=me")), KubeWrite)


def test_the_fake_reads_no_query_past_goes_limit() -> None:
    assert go_query("/x?" + "&" * 9_999 + "dryRun=All") == {"dryRun": ["All"]}
    assert go_query("/x?" + "&" * 10_000 + "dryRun=All") == {}


@pytest.mark.parametrize(
    ("query", "refused"),
    [
        ("&" * 999 + "fieldManager=me", False),  # 1,000 parameters
        ("&" * 1000 + "fieldManager=me", True),
        ("&" * 10_000 + "dryRun=All", True),
    ],
)
def test_a_write_with_too_many_query_parameters_is_refused(query: str, refused: bool) -> None:
    result = map_request(KUBE, flow_request(f"{SCALE}?{query}"))
    assert isinstance(result, Invalid) is refused, result
    if refused:
        assert "more than 1,000 parameters" in result.reason


ALLOW = dataclasses.replace(KUBE, unmapped_writes="allow")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/v1/nodes/n1/proxy/run/prod/web-0/app"),  # runs ?cmd=, no Upgrade
        ("POST", "/api/v1/nodes/n1:10250/proxy/exec/prod/web-0/app"),
        ("PUT", "/api/v1/nodes/https:n1:10250/proxy/debug/flags/v"),
        ("POST", "/api/v1/proxy/nodes/n1/run/prod/web-0/app"),  # before Kubernetes 1.10
    ],
)
def test_a_write_to_a_kubelet_through_the_node_proxy_is_refused(method: str, path: str) -> None:
    request = Request(method, path, {"cmd": ["rm -rf /data"]}, {}, b"")
    for upstream in (KUBE, ALLOW):  # whatever unmapped_writes says
        result = map_request(upstream, request)
        assert isinstance(result, Invalid), result
        assert "kubelet" in result.reason


def test_a_read_through_the_node_proxy_is_refused_too() -> None:
    # The kubelet's (or any application's) GET is its own to say: no proxy path is a read.
    request = Request("GET", "/api/v1/nodes/n1/proxy/metrics", {}, {}, b"")
    result = map_request(ALLOW, request)
    assert isinstance(result, Invalid), result
    assert "kubelet" in result.reason
