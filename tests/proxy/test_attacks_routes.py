"""Requests a remote may read as another write than ctrlrun does: each one is refused.

Servers differ from ctrlrun's strict reading in a few known ways: Go's encoding/json (the Go
MCP SDKs, many custom services) and ASP.NET match JSON keys without regard to case, the last
one winning; Go reads the first of two headers, others the last; Flask, Spring and PHP read
a write's query beside its body; Rack before 3 splits a query on ';'.
"""

from __future__ import annotations

from typing import Any

import pytest

from ctrlrun.proxy.config import Route, Upstream
from ctrlrun.proxy.mcp_config import McpTool
from ctrlrun.proxy.mcp_messages import ProtocolError, load_messages, tool_call
from ctrlrun.proxy.mcp_tools import map_call
from ctrlrun.proxy.route_values import BadInput, KubeWrite
from ctrlrun.proxy.routes import Invalid, Mapped, Request, Unmapped, map_request

STRIPE = Upstream("stripe", "stripe", "https://api.stripe.com", "https", "api.stripe.com", 443)
KUBE = Upstream("k", "kubernetes", "https://k:6443", "https", "k", 6443, cluster="c")
HTTP = Upstream(
    "billing",
    "http",
    "http://b:80",
    "http",
    "b",
    80,
    routes=(Route("POST", "/v1/charges/{charge}/capture", "billing.capture"),),
)
FORM = "application/x-www-form-urlencoded"
JSON = "application/json"
CAPTURE = "/v1/charges/ch_1/capture"
DEPLOY = "/apis/apps/v1/namespaces/prod/deployments/web"


def req(
    method: str,
    path: str,
    body: bytes = b"",
    kind: str | None = None,
    query: dict[str, list[str]] | None = None,
    repeated: frozenset[str] = frozenset(),
) -> Request:
    headers = {"content-type": kind} if kind else {}
    return Request(method, path, query or {}, headers, body, repeated)


TWICE = frozenset({"content-type"})


@pytest.mark.parametrize(
    ("upstream", "request_", "fragment"),
    [
        (HTTP, req("POST", CAPTURE, b'{"amount":1,"Amount":9}', JSON), "case aside"),
        (HTTP, req("POST", CAPTURE, b'{"m":{"k":1,"K":2}}', JSON), "case aside"),
        (HTTP, req("POST", CAPTURE, b'{"amount":1}', JSON, repeated=TWICE), "content-type"),
        (
            HTTP,
            req("POST", CAPTURE, b"a=1", FORM, repeated=frozenset({"content-encoding"})),
            "content-encoding",
        ),
        (HTTP, req("POST", CAPTURE, b"amount=5", FORM, {"amount": ["9"]}), "both the query"),
        (HTTP, req("POST", CAPTURE, b'{"amount":5}', JSON, {"amount": ["9"]}), "both the query"),
        (HTTP, req("POST", CAPTURE, b"", None, {"charge": ["ch_2"]}), "the path says"),
        (
            STRIPE,
            req("POST", "/v1/refunds", b"payment_intent=pi_1", FORM, repeated=TWICE),
            "content-type",
        ),
        (
            STRIPE,
            req("POST", "/v1/refunds", b"amount=5", FORM, {"payment_intent": ["pi_1;amount=9"]}),
            "';'",
        ),
        (
            STRIPE,
            req("POST", "/v1/refunds", b"amount=5", FORM, {"payment_intent;amount": ["9"]}),
            "';'",
        ),
        (
            KUBE,
            req("PATCH", DEPLOY, b"{}", "application/merge-patch+json", repeated=TWICE),
            "content-type",
        ),
    ],
)
def test_writes_a_server_may_read_otherwise_are_invalid(
    upstream: Upstream, request_: Request, fragment: str
) -> None:
    result = map_request(upstream, request_)
    assert isinstance(result, Invalid), result
    assert fragment in result.reason


MULTIPART = "multipart/form-data; boundary=b"
PART = b'--b\r\nContent-Disposition: form-data; name="_method"\r\n\r\nDELETE\r\n--b--\r\n'


@pytest.mark.parametrize(
    "request_",
    [
        req("POST", CAPTURE, b"amount=5&_method=DELETE", FORM),
        req("POST", CAPTURE, b"%5Fmethod=delete", FORM),
        req("POST", CAPTURE, b"_method[]=PUT", FORM),
        req("POST", CAPTURE, PART, MULTIPART),
        req("POST", CAPTURE, b'{"amount":5,"_method":"DELETE"}', JSON),
        req("POST", "/v1/unmapped", b"_method=DELETE", FORM),  # under unmapped_writes: allow too
        req("POST", "/v1/refunds", b"payment_intent=pi_1&_method=DELETE", FORM),
    ],
)
def test_a_method_override_in_the_body_is_refused(request_: Request) -> None:
    for upstream in (HTTP, STRIPE):
        result = map_request(upstream, request_)
        assert isinstance(result, Invalid) and "_method" in result.reason, result


OPEN = Upstream(
    "billing",
    "http",
    "http://b:80",
    "http",
    "b",
    80,
    routes=(Route("POST", "/v1/invoices/{invoice}/send", "billing.send"),),
    unmapped_writes="allow",
)


@pytest.mark.parametrize(
    ("upstream", "path"),
    [
        (OPEN, "/V1/Invoices/in_1/SEND"),  # ASP.NET routes ignore case
        (OPEN, "/v1/invoices/in_1/send.json"),  # Rails: '(.:format)'
        (STRIPE, "/V1/Refunds"),
        (STRIPE, "/v1/refunds.json"),
        (STRIPE, "/v1/refunds."),  # IIS drops trailing dots and spaces
        (OPEN, "/v1/invoices/in_1/send%20"),
    ],
)
def test_a_path_a_server_may_read_as_a_route_is_refused_not_unmapped(
    upstream: Upstream, path: str
) -> None:
    body = b"payment_intent=pi_1" if upstream is STRIPE else b""
    result = map_request(upstream, req("POST", path, body, FORM if body else None))
    assert isinstance(result, Invalid) and "may read it as that route" in result.reason, result
    # Another path, or the route's own, is what it was.
    assert isinstance(map_request(OPEN, req("POST", "/v1/invoices/in_1/sent")), Unmapped)
    assert isinstance(map_request(OPEN, req("POST", "/v1/invoices/in_1/send")), Mapped)


@pytest.mark.parametrize(
    "path", ["/v1/invoices/in_1;jsessionid=x/send", "/v1/invoices/in_1/send;x", "/v1/in%3Bx/send"]
)
def test_a_path_parameter_is_refused(path: str) -> None:
    # Spring and Tomcat drop it: "in_1;x" would be another effect key for the same invoice.
    result = map_request(OPEN, req("POST", path))
    assert isinstance(result, Invalid) and "';'" in result.reason, result


@pytest.mark.parametrize("path", ["/v1\\charges", "/v1%5Ccharges", "/v1/invoices/a%5Cb/send"])
def test_a_backslash_in_a_write_path_is_refused(path: str) -> None:
    result = map_request(OPEN, req("POST", path))
    assert isinstance(result, Invalid) and "backslash" in result.reason, result


@pytest.mark.parametrize(
    "name",
    [
        "X_HTTP_METHOD_OVERRIDE",
        "x-http_method-override",
        "X_Method_Override",
        "x_http_method",
        "X-Original-URL",
        "X_Rewrite_Url",
    ],
)
def test_an_override_header_spelt_with_underscores_is_an_override(name: str) -> None:
    # Rack and CGI read '_' and '-' alike: X_HTTP_METHOD_OVERRIDE is the override there.
    got = map_request(HTTP, Request("GET", "/v1/x", {}, {name.lower(): "DELETE"}))
    assert isinstance(got, Invalid) and "method" in got.reason, got


@pytest.mark.parametrize("charset", ["utf-7", '"UTF-16"', "iso-8859-1"])
def test_a_body_in_another_charset_is_refused(charset: str) -> None:
    kind = f"{FORM}; charset={charset}"
    result = map_request(STRIPE, req("POST", "/v1/refunds", b"payment_intent=pi_1", kind))
    assert isinstance(result, Invalid) and "charset" in result.reason, result
    with pytest.raises(ProtocolError):
        load_messages(
            b'{"jsonrpc":"2.0","method":"ping"}', {"content-type": f"{JSON}; charset={charset}"}
        )
    for fine in ("utf-8", "UTF-8", '"utf-8"'):
        kind = f"{FORM}; charset={fine}"
        got = map_request(STRIPE, req("POST", "/v1/refunds", b"payment_intent=pi_1", kind))
        assert isinstance(got, Mapped), got


def test_the_query_of_an_http_write_is_read_with_its_body() -> None:
    got = map_request(HTTP, req("POST", CAPTURE, b'{"amount":5}', JSON, {"notify": ["no"]}))
    assert got == Mapped("billing.capture", {"amount": 5, "notify": "no", "charge": "ch_1"})
    got = map_request(HTTP, req("POST", CAPTURE, b"", None, {"tag": ["a", "b"]}))
    assert got == Mapped("billing.capture", {"tag": ["a", "b"], "charge": "ch_1"})


def test_kubernetes_objects_may_hold_keys_that_differ_in_case() -> None:
    # Labels "app" and "App" are two labels; the apiserver's own dry run decides the write.
    body = b'{"metadata":{"labels":{"app":"a","App":"b"}}}'
    got = map_request(KUBE, req("PATCH", DEPLOY, body, "application/merge-patch+json"))
    assert isinstance(got, KubeWrite)


def test_a_delete_body_whose_dry_run_repeats_under_case_is_protected() -> None:
    # An apiserver reading keys loosely would take the last: no dry run.
    body = b'{"dryRun":["All"],"DRYRUN":[]}'
    got = map_request(KUBE, req("DELETE", DEPLOY, body, JSON, {"dryRun": ["All"]}))
    assert isinstance(got, Mapped) and got.action == "k8s.delete_deployment"


CALL = '{"jsonrpc":"2.0","id":1,%s,"params":%s}'


@pytest.mark.parametrize(
    "body",
    [
        CALL % ('"Method":"tools/call"', '{"name":"t"}'),
        CALL % ('"method":"ping","METHOD":"tools/call"', '{"name":"t"}'),
        CALL % ('"method":"tools/call","Params":{}', '{"name":"t"}'),
        CALL % ('"method":"tools/call"', '{"name":"t","arguments":{"a":1,"A":2}}'),
        CALL % ('"method":"tools/call"', '{"name":"t","NAME":"w"}'),
        "[" + CALL % ('"Method":"tools/call"', '{"name":"t"}') + "]",
        '{"jsonrpc":"2.0","ID":1,"method":"tools/call","params":{"name":"t"}}',
        # Not JSON-RPC 2.0 at all: another API of the same host, never "no tools/call".
        '{"amount":900000,"payment_intent":"pi_1"}',
        '{"jsonrpc":"1.0","method":"tools/call","id":1,"params":{"name":"t"}}',
        '{"jsonrpc":"2.0","id":1}',
        '{"jsonrpc":"2.0","id":1,"result":{},"error":{}}',
        '[{"jsonrpc":"2.0","method":"ping","id":1},{"refund":1}]',
    ],
)
def test_mcp_messages_with_keys_a_server_may_fold_are_refused(body: str) -> None:
    with pytest.raises(ProtocolError):
        load_messages(body.encode(), {})


@pytest.mark.parametrize(
    "params", ['{"Name":"w"}', '{"name":"t","Arguments":{}}', '{"name":"t","_META":{}}']
)
def test_tool_call_params_with_folded_keys_are_refused(params: str) -> None:
    with pytest.raises(ProtocolError) as info:
        tool_call(load_messages((CALL % ('"method":"tools/call"', params)).encode(), {}))  # type: ignore[arg-type]
    assert info.value.request_id == 1


REFUND = McpTool("create_refund", "stripe.refund", aliases=(("payment_id", ("payment_intent",)),))


@pytest.mark.parametrize(
    "arguments",
    [
        {"payment_intent": "pi_1", "Amount": 900000},
        {"payment_intent": "pi_1", "Application_Fee_Amount": 9},
        {"Payment_Intent": "pi_1", "amount": 5},
    ],
)
def test_case_variants_of_names_ctrlrun_reads_are_refused(arguments: dict[str, Any]) -> None:
    with pytest.raises(BadInput):
        map_call(REFUND, arguments)
    assert map_call(REFUND, {"payment_intent": "pi_1", "Note": "x"}).arguments["Note"] == "x"
