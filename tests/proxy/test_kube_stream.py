"""Writes that hide: Upgrade, method overrides, odd methods, and the Kubernetes stream actions
(exec, attach, portforward) in their WebSocket and SPDY forms."""

from __future__ import annotations

from typing import Any

import pytest

from ctrlrun.proxy.config import Route, Upstream
from ctrlrun.proxy.route_values import hidden_write
from ctrlrun.proxy.routes import Invalid, Mapped, PassThrough, Request, Unmapped, map_request

KUBE = Upstream(
    name="prod-eu",
    profile="kubernetes",
    url="https://10.0.0.1:6443",
    scheme="https",
    host="10.0.0.1",
    port=6443,
    cluster="eu-1",
)
STRIPE = Upstream(
    name="stripe", profile="stripe", url="https://s", scheme="https", host="s", port=443
)
HTTP = Upstream(
    name="billing",
    profile="http",
    url="http://b:8000",
    scheme="http",
    host="b",
    port=8000,
    routes=(Route("POST", "/v1/invoices/{invoice_id}/send", "billing.send_invoice"),),
)
POD = "/api/v1/namespaces/prod/pods/web-0"
WEBSOCKET = {"upgrade": "websocket", "connection": "Upgrade", "sec-websocket-version": "13"}
SPDY = {"upgrade": "SPDY/3.1", "connection": "Upgrade"}


def req(
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    query: dict[str, list[str]] | None = None,
) -> Request:
    return Request(method, path, query or {}, headers or {}, b"")


@pytest.mark.parametrize(
    ("method", "headers", "query", "read"),
    [
        ("GET", {}, {}, True),
        ("HEAD", {"accept": "*/*"}, {}, True),
        ("OPTIONS", {}, {"watch": ["true"]}, True),
        ("GET", {"upgrade": "websocket"}, {}, False),
        ("HEAD", {"upgrade": "h2c"}, {}, False),
        ("GET", {"x-http-method-override": "DELETE"}, {}, False),
        ("GET", {"x-http-method": "PATCH"}, {}, False),
        ("OPTIONS", {"x-method-override": "PUT"}, {}, False),
        ("GET", {}, {"_method": ["DELETE"]}, False),
        ("get", {}, {}, False),
        ("PROPFIND", {}, {}, False),
        ("POST", {}, {}, False),
    ],
)
def test_hidden_write(
    method: str, headers: dict[str, str], query: dict[str, list[str]], read: bool
) -> None:
    assert (hidden_write(method, headers, query) is None) is read


@pytest.mark.parametrize("upstream", [KUBE, STRIPE, HTTP])
@pytest.mark.parametrize(
    "headers",
    [{"x-http-method-override": "DELETE"}, {"x-http-method": "DELETE"}, {"x-method-override": "x"}],
)
@pytest.mark.parametrize("method", ["GET", "POST", "HEAD"])
def test_a_method_override_is_refused_whatever_the_method(
    upstream: Upstream, headers: dict[str, str], method: str
) -> None:
    result = map_request(upstream, req(method, "/v1/invoices/i/send", headers))
    assert isinstance(result, Invalid)
    assert "may apply another method" in result.reason


def test_a_method_override_parameter_is_refused() -> None:
    result = map_request(KUBE, req("GET", "/api/v1/namespaces/x", query={"_method": ["DELETE"]}))
    assert isinstance(result, Invalid)
    assert "?_method=" in result.reason


@pytest.mark.parametrize("upstream", [KUBE, STRIPE, HTTP])
@pytest.mark.parametrize("headers", [WEBSOCKET, SPDY, {"upgrade": "h2c"}])
def test_an_upgrade_no_route_maps_is_refused(upstream: Upstream, headers: dict[str, str]) -> None:
    for method in ("GET", "HEAD", "OPTIONS", "POST"):
        result = map_request(
            upstream, req(method, "/api/v1/namespaces/x/services/s/proxy", headers)
        )
        assert isinstance(result, Invalid), (method, result)
        assert "upgrade" in result.reason


def test_an_upgrade_on_a_mapped_write_is_still_that_write() -> None:
    # The protected forwarder drops Upgrade (hop-by-hop): the remote sees the plain write.
    body = b"amount=100&payment_intent=pi_1"
    headers = {"upgrade": "websocket", "content-type": "application/x-www-form-urlencoded"}
    request = Request("POST", "/v1/refunds", {}, headers, body)
    result = map_request(STRIPE, request)
    assert isinstance(result, Mapped) and result.action == "stripe.refund"


EXEC_CASES: list[tuple[Request, str, dict[str, Any]]] = [
    (
        req(
            "GET",
            f"{POD}/exec",
            WEBSOCKET,
            {"command": ["sh", "-c", "rm -rf /data"], "container": ["app"], "stdout": ["true"]},
        ),
        "k8s.exec",
        {"container": "app", "command": ["sh", "-c", "rm -rf /data"]},
    ),
    (
        req("POST", f"{POD}/exec", SPDY, {"command": ["date"]}),
        "k8s.exec",
        {"container": None, "command": ["date"]},
    ),
    (req("POST", f"{POD}/exec/", {}, {}), "k8s.exec", {"container": None, "command": []}),
    (  # the exec handler ignores dryRun: it is no dry run here
        req("POST", f"{POD}/exec", SPDY, {"dryRun": ["All"], "command": ["ls"]}),
        "k8s.exec",
        {"container": None, "command": ["ls"]},
    ),
    (
        req("GET", f"{POD}/attach", WEBSOCKET, {"container": ["app"]}),
        "k8s.attach",
        {"container": "app"},
    ),
    (req("POST", f"{POD}/attach", SPDY), "k8s.attach", {"container": None}),
    (
        req("GET", f"{POD}/portforward", WEBSOCKET, {"ports": ["8080", "9090"]}),
        "k8s.port_forward",
        {"ports": [8080, 9090]},
    ),
    (req("POST", f"{POD}/portforward", SPDY), "k8s.port_forward", {"ports": []}),
]


@pytest.mark.parametrize(("request_", "action", "extra"), EXEC_CASES)
def test_stream_actions(request_: Request, action: str, extra: dict[str, Any]) -> None:
    result = map_request(KUBE, request_)
    expected = {"cluster": "eu-1", "namespace": "prod", "pod": "web-0", **extra}
    assert result == Mapped(action, expected)


def test_an_exec_without_upgrade_as_get_is_a_read_the_apiserver_refuses() -> None:
    # Without Upgrade the apiserver answers 400 "Upgrade request required": nothing runs.
    assert isinstance(
        map_request(KUBE, req("GET", f"{POD}/exec", {}, {"command": ["ls"]})), PassThrough
    )


@pytest.mark.parametrize(
    ("request_", "fragment"),
    [
        (req("GET", f"{POD}/exec", WEBSOCKET, {"command": ["ls;command=rm"]}), "';'"),
        (req("GET", f"{POD}/exec", WEBSOCKET, {"command;x": ["ls"]}), "';'"),
        (req("GET", f"{POD}/exec", WEBSOCKET, {"container": ["a", "b"]}), "container 2 times"),
        (req("GET", f"{POD}/portforward", WEBSOCKET, {"ports": ["http"]}), "ports must be"),
        (req("GET", f"{POD}/portforward", WEBSOCKET, {"ports": ["0"]}), "ports must be"),
        (req("GET", f"{POD}/portforward", WEBSOCKET, {"ports": ["70000"]}), "ports must be"),
        # SPDY streams name their own ports, which the kubelet forwards: the query's are not.
        (req("GET", f"{POD}/portforward", SPDY, {"ports": ["5432,6379"]}), "inside the stream"),
        (req("GET", "/api/v1/namespaces/prod/pods/%2e%2e/exec", WEBSOCKET), "ambiguous"),
        (req("GET", f"{POD}/exec", WEBSOCKET, {"container": ["a\nb"]}), "control character"),
    ],
)
def test_stream_actions_refuse_what_reads_two_ways(request_: Request, fragment: str) -> None:
    result = map_request(KUBE, request_)
    assert isinstance(result, Invalid)
    assert fragment in result.reason


@pytest.mark.parametrize("method", ["PUT", "PATCH", "DELETE"])
def test_other_methods_on_stream_paths_are_unmapped(method: str) -> None:
    assert isinstance(map_request(KUBE, req(method, f"{POD}/exec")), Unmapped)


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/nodes/n1/proxy/exec/prod/web-0/app",  # the kubelet's own exec, via node proxy
        "/api/v1/namespaces/prod/pods/web-0/proxy/run",
        "/api/v1/namespaces/prod/pods/web-0/log",
    ],
)
def test_other_upgrades_to_kubernetes_are_refused(path: str) -> None:
    result = map_request(KUBE, req("GET", path, WEBSOCKET, {"command": ["sh"]}))
    assert isinstance(result, Invalid)


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        (b"GET", b"/v1/charges?limit=3", [(b"Accept", b"*/*")]),
        (b"HEAD", b"/", []),
        (b"OPTIONS", b"/x", []),
        (b"get", b"/", []),
        (b"DELETE", b"/", []),
        (b"GET", b"/exec", [(b"UPGRADE", b"websocket")]),
        (b"GET", b"/", [(b"X-Http-Method-Override", b"DELETE")]),
        (b"GET", b"/", [(b"x-http-method", b"DELETE")]),
        (b"GET", b"/", [(b"X-Method-Override", b"PUT")]),
        (b"GET", b"/", [(b"X_HTTP_METHOD_OVERRIDE", b"DELETE")]),
        (b"GET", b"/", [(b"x-http_method", b"DELETE")]),
        (b"GET", b"/", [(b"X-Original-URL", b"/v1/refunds")]),
        (b"GET", b"/v1?_method=DELETE", []),
        (b"GET", b"/v1?%5Fmethod=DELETE", []),
        (b"GET", b"/v1?a=%20b", []),
        (b"GET", b"/v1/my_method_thing", []),
    ],
)
def test_the_addons_fast_read_check_is_hidden_write(
    method: bytes, path: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    from mitmproxy import http
    from mitmproxy.test import tutils

    from ctrlrun.proxy.addon import _is_read

    flow_request = tutils.treq(method=method, path=path, headers=http.Headers(headers), content=b"")
    names = {k.decode().lower(): v.decode() for k, v in headers}
    query = {k: flow_request.query.get_all(k) for k in flow_request.query}
    assert _is_read(flow_request) is (hidden_write(method.decode(), names, query) is None)
    # A body, or a header folded over two lines, leaves the fast path: the guard refuses it.
    flow_request.raw_content = b"POST /v1/refunds HTTP/1.1\r\n\r\n"
    assert not _is_read(flow_request)
    flow_request.raw_content = b""
    flow_request.headers.fields += ((b"X-A", b"a\r\n X-Http-Method-Override: DELETE"),)
    assert not _is_read(flow_request)
