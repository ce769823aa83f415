"""More MCP bodies a server may read as another request than ctrlrun does, through the sidecar.

Each must be refused with nothing forwarded (the fake's ``received`` and ``requests`` stay as
they were), and the plain MCP traffic around it must keep working.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from harness import STRIPE_KEY, Sidecar

from ctrlrun.testing import FakeKubernetes, FakeStripe
from ctrlrun.testing.stripe_mcp import FakeStripeMcp

pytestmark = pytest.mark.timeout(120)
INIT = (
    b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
    b'"capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}'
)
PING = b'{"jsonrpc":"2.0","id":9,"method":"ping"}'


@pytest.fixture
def sc(mcp_sidecar: Sidecar) -> Sidecar:
    return mcp_sidecar  # the conftest's, in front of its mcp_server


@pytest.fixture
def http(sc: Sidecar, mcp_server: FakeStripeMcp) -> Iterator[tuple[httpx.Client, dict[str, str]]]:
    """A raw session through the sidecar: the client and the headers naming the session."""
    client = httpx.Client(proxy=sc.proxy_url, trust_env=False, timeout=30)
    headers = {
        "Authorization": f"Bearer {STRIPE_KEY}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    first = client.post(mcp_server.url, content=INIT, headers=headers)
    assert first.status_code == 200, first.text
    headers["Mcp-Session-Id"] = first.headers["mcp-session-id"]
    headers["Mcp-Protocol-Version"] = "2025-06-18"
    note = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'
    assert client.post(mcp_server.url, content=note, headers=headers).status_code == 202
    try:
        yield client, headers
    finally:
        client.close()


def _refused_unsent(got: httpx.Response, server: FakeStripeMcp, before: int) -> None:
    assert got.status_code == 400, got.text
    assert got.headers.get("x-ctrlrun-outcome") == "invalid_request", got.text
    assert got.json()["error"]["message"].startswith("ctrlrun: "), got.text
    assert len(server.requests) == before, server.requests[before:]  # nothing forwarded


def _smuggled_in_utf7(pi: str) -> bytes:
    """A ping as UTF-8; as UTF-7 (``+ACI-`` is a quote) the same bytes are a refund."""
    hidden = (
        '"},"method":"tools/call","params":{"name":"create_refund","arguments":'
        f'{{"payment_intent":"{pi}","amount":900000}}}},"z":{{"y":"'
    )
    return (
        '{"jsonrpc":"2.0","id":3,"method":"ping","params":{"x":"'
        + hidden.replace('"', "+ACI-")
        + '"}}'
    ).encode()


def test_a_second_content_type_cannot_hide_the_charset_a_server_decodes_with(
    sc: Sidecar,
    fakes: tuple[FakeStripe, FakeKubernetes],
    mcp_server: FakeStripeMcp,
    http: tuple[httpx.Client, dict[str, str]],
) -> None:
    # The TypeScript SDK's server decodes a POST in the charset of its Content-Type (raw-body,
    # iconv-lite: UTF-7 included), and Node keeps the first of two Content-Type headers;
    # ctrlrun read the last. The body below is a ping in UTF-8 and a refund in UTF-7.
    client, headers = http
    pi = fakes[0].add_payment_intent(amount=1_000_000)["id"]
    body = _smuggled_in_utf7(pi)
    assert json.loads(body)["method"] == "ping"
    assert json.loads(body.decode("utf-7"))["method"] == "tools/call"
    rest = [(k, v) for k, v in headers.items() if k != "Content-Type"]
    for types in (
        ["application/json; charset=utf-7", "application/json"],
        ["application/json", "application/json; charset=utf-7"],
    ):
        before = len(mcp_server.requests)
        sent = [*rest, *(("Content-Type", t) for t in types)]
        got = client.post(mcp_server.url, content=body, headers=sent)
        _refused_unsent(got, mcp_server, before)
        assert "content-type is sent more than once" in got.text
    # One Content-Type naming UTF-7 was refused already; a plain one still passes.
    assert client.post(mcp_server.url, content=PING, headers=headers).status_code == 200


@pytest.mark.parametrize(
    ("path", "body"),
    [
        # A REST API beside the MCP endpoint reads its fields and ignores "jsonrpc", "method".
        (
            "/v1/refunds",
            '{"jsonrpc":"2.0","method":"notifications/initialized",'
            '"payment_intent":"{pi}","amount":900000}',
        ),
        ("/v1/refunds", '[{"jsonrpc":"2.0","id":4,"method":"ping","amount":900000}]'),
        # Laravel reads "_method" from a JSON body as the method to run: a DELETE.
        ("/v1/customers/cus_1", '{"jsonrpc":"2.0","id":5,"method":"ping","_method":"DELETE"}'),
        # A response-shaped message carrying a request's fields.
        ("/", '{"jsonrpc":"2.0","id":6,"result":{},"name":"create_refund","arguments":{}}'),
    ],
)
def test_members_json_rpc_does_not_have_are_refused(
    sc: Sidecar,
    fakes: tuple[FakeStripe, FakeKubernetes],
    mcp_server: FakeStripeMcp,
    http: tuple[httpx.Client, dict[str, str]],
    path: str,
    body: str,
) -> None:
    client, headers = http
    pi = fakes[0].add_payment_intent(amount=1_000_000)["id"]
    before = len(mcp_server.requests)
    got = client.post(mcp_server.url + path, content=body.replace("{pi}", pi), headers=headers)
    _refused_unsent(got, mcp_server, before)
    assert "JSON-RPC has no member" in got.text, got.text
    assert client.post(mcp_server.url, content=PING, headers=headers).status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        # Another JSON-RPC API on the MCP host: its methods are its writes.
        '{"jsonrpc":"2.0","id":7,"method":"refunds.create","params":{"payment_intent":"{pi}"}}',
        '{"jsonrpc":"2.0","method":"notifications/refund","params":{"payment_intent":"{pi}"}}',
        '[{"jsonrpc":"2.0","id":8,"method":"eth_sendTransaction","params":[]}]',
        # Not MCP's spelling: no tool call to ctrlrun, and not ctrlrun's to guess at.
        '{"jsonrpc":"2.0","id":9,"method":"tools/call ","params":{"name":"create_refund"}}',
    ],
)
@pytest.mark.parametrize("path", ["/", "/rpc"])
def test_a_method_mcp_does_not_have_is_refused(
    sc: Sidecar,
    fakes: tuple[FakeStripe, FakeKubernetes],
    mcp_server: FakeStripeMcp,
    http: tuple[httpx.Client, dict[str, str]],
    body: str,
    path: str,
) -> None:
    client, headers = http
    pi = fakes[0].add_payment_intent(amount=1_000_000)["id"]
    before = len(mcp_server.requests)
    got = client.post(mcp_server.url + path, content=body.replace("{pi}", pi), headers=headers)
    _refused_unsent(got, mcp_server, before)
    assert "is not a method MCP clients send" in got.text, got.text
    assert client.post(mcp_server.url, content=PING, headers=headers).status_code == 200
