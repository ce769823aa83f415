"""Kubernetes writes whose request target the apiserver (Go) reads otherwise than ctrlrun
(Python), through a real sidecar to the fake apiserver, which reads a query as Go does
(``ctrlrun.testing.kubernetes.routes.go_query``): each is refused and changes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness import POLICY, Sidecar, running_sidecar
from test_attacks_kube import MERGE, send

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(180)
SCALE = "/apis/apps/v1/namespaces/default/deployments/checkout/scale"
SCALE_TO_50 = b'{"spec":{"replicas":50}}'


def refused(sidecar: Sidecar, kube: FakeKubernetes, target: str) -> None:
    status, got, text = send(
        sidecar.kube_base, "PATCH", target, [("Content-Type", MERGE)], SCALE_TO_50
    )
    assert got.get("x-ctrlrun-outcome") == "invalid_request", (target[:80], status, text)
    assert status == 422 and json.loads(text)["kind"] == "Status", text
    assert kube.replicas("default", "checkout") == 3
    assert kube.count("PATCH") == 0  # not even ctrlrun's own dry run was sent


@pytest.mark.parametrize(
    "query",
    [
        # Python ends the query at '#' and reads dryRun=All; Go keeps "All#;" in the pair,
        # drops the pair for its ';' and applies the patch.
        "?dryRun=All#;",
        "?dryRun=All#%zz",  # Go drops the pair for its bad escape
    ],
)
def test_a_dry_run_cut_short_by_a_hash_is_refused(
    sidecar: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], query: str
) -> None:
    refused(sidecar, fakes[1], SCALE + query)


DENY_SCALE = POLICY.replace(
    'effect: "scale:{{cluster}}:{{deployment}}:{{replicas}}"\n    decision: allow',
    'effect: "scale:{{cluster}}:{{deployment}}:{{replicas}}"\n    decision: deny',
)
TOO_MANY = "?" + "&" * 10_000  # 10,001 parameters: Go's apiserver reads none of them


@pytest.mark.parametrize(
    "query",
    [
        # ctrlrun asks the apiserver what the write does with the agent's query plus
        # "&dryRun=All"; past 10,000 parameters Go reads none, and that question is the write.
        TOO_MANY + "fieldManager=agent",
        TOO_MANY + "dryRun=All",  # the agent's own dry run, unread by Go: a real write
    ],
)
def test_a_query_too_long_for_go_is_refused(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes], query: str
) -> None:
    with running_sidecar(tmp_path, *fakes, policy_text=DENY_SCALE, in_process=True) as sidecar:
        refused(sidecar, fakes[1], SCALE + query)


ALLOW_UNMAPPED = POLICY.replace(
    "    cluster: prod-eu\n", "    cluster: prod-eu\n    unmapped_writes: allow\n"
)


def test_a_command_run_through_the_node_proxy_is_refused_under_unmapped_writes_allow(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    # The kubelet's /run takes a POST with no Upgrade and runs ?cmd= in the container: under
    # unmapped_writes: allow it would be forwarded as an unmapped write, not decided as exec.
    kube = fakes[1]
    with running_sidecar(tmp_path, *fakes, policy_text=ALLOW_UNMAPPED, in_process=True) as sidecar:
        target = "/api/v1/nodes/node-1/proxy/run/default/checkout-0/app?cmd=rm+-rf+/data"
        status, got, text = send(sidecar.kube_base, "POST", target, [])
        assert got.get("x-ctrlrun-outcome") == "invalid_request", (status, text)
        assert status == 422 and b"kubelet" in text
        assert kube.count("POST") == 0
        # Other unmapped writes still go, recorded: the fake answers this one 404.
        status, got, _ = send(
            sidecar.kube_base, "POST", "/api/v1/namespaces/default/configmaps", []
        )
        assert kube.count("POST") == 1
