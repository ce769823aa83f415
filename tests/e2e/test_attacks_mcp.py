"""MCP bodies a server may read as another tool call than ctrlrun does, through the sidecar.

Go's encoding/json (which the Go MCP SDKs use) matches keys without regard to case and lets
the last of two such keys win: ``"Method": "tools/call"`` is a tool call there, and
``{"amount": 100, "Amount": 900000}`` an amount of 900000. Each of these bodies must be refused
with nothing forwarded, and no refund made.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import STRIPE_KEY, Sidecar
from mcp_support import start_mcp_sidecar

from ctrlrun.testing import FakeKubernetes, FakeStripe
from ctrlrun.testing.stripe_mcp import FakeStripeMcp

pytestmark = pytest.mark.timeout(120)
INIT = (
    b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
    b'"capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}'
)


@pytest.fixture
def mcp_server(fakes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[FakeStripeMcp]:
    with FakeStripeMcp(fakes[0], json_response=True) as server:
        yield server


@pytest.fixture
def sc(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes], mcp_server: FakeStripeMcp
) -> Iterator[Sidecar]:
    sidecar = start_mcp_sidecar(tmp_path, fakes[0], fakes[1], mcp_server)
    yield sidecar
    sidecar.stop()


def _session(url: str, proxy: str) -> tuple[httpx.Client, dict[str, str]]:
    http = httpx.Client(proxy=proxy, trust_env=False, timeout=30)
    headers = {
        "Authorization": f"Bearer {STRIPE_KEY}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    first = http.post(url, content=INIT, headers=headers)
    assert first.status_code == 200, first.text
    headers["Mcp-Session-Id"] = first.headers["mcp-session-id"]
    headers["Mcp-Protocol-Version"] = "2025-06-18"
    done = http.post(
        url, content=b'{"jsonrpc":"2.0","method":"notifications/initialized"}', headers=headers
    )
    assert done.status_code == 202
    return http, headers


def _call(params: str, rid: int = 1, method: str = '"method":"tools/call"') -> bytes:
    return f'{{"jsonrpc":"2.0","id":{rid},{method},"params":{params}}}'.encode()


REFUND = '{{"name":"create_refund","arguments":{{"payment_intent":"{pi}","amount":100{extra}}}}}'


def _bodies(pi: str) -> list[bytes]:
    refund = REFUND.format(pi=pi, extra="")
    return [
        # The method under another case: no tool call for ctrlrun, one for the server.
        _call(refund, method='"Method":"tools/call"'),
        _call(refund, method='"method":"ping","METHOD":"tools/call"'),
        # A read tool for ctrlrun, the refund for the server.
        _call(
            '{"name":"retrieve_balance","NAME":"create_refund","arguments":'
            f'{{"payment_intent":"{pi}","amount":100}}}}'
        ),
        _call(f'{{"name":"create_refund","Arguments":{{"payment_intent":"{pi}","amount":1}}}}'),
        # An amount ctrlrun checks, and the one the server would refund.
        _call(REFUND.format(pi=pi, extra=',"Amount":900000')),
        _call(f'{{"name":"create_refund","arguments":{{"payment_intent":"{pi}","AMOUNT":1}}}}'),
        # The same inside a batch.
        b"[" + _call(refund, rid=2, method='"Method":"tools/call"') + b"]",
    ]


def test_keys_a_server_may_read_without_case_are_refused_and_nothing_is_forwarded(
    sc: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], mcp_server: FakeStripeMcp
) -> None:
    stripe = fakes[0]
    pi = stripe.add_payment_intent(amount=1_000_000)["id"]
    http, headers = _session(mcp_server.url, sc.proxy_url)
    try:
        for body in _bodies(pi):
            before = len(mcp_server.received)
            got = http.post(mcp_server.url, content=body, headers=headers)
            assert got.headers.get("x-ctrlrun-outcome") == "invalid_request", (body, got.text)
            answer: Any = got.json()
            answer = answer[0] if isinstance(answer, list) else answer
            message = (
                answer.get("error", {}).get("message") or answer["result"]["content"][0]["text"]
            )
            assert str(message).startswith("ctrlrun: "), answer
            assert len(mcp_server.received) == before, body  # nothing forwarded
        assert stripe.refunds == []
        # The plain call still goes through, once.
        plain = _call(REFUND.format(pi=pi, extra=""), rid=5)
        got = http.post(mcp_server.url, content=plain, headers=headers)
        assert got.status_code == 200 and not got.json()["result"].get("isError"), got.text
        assert [r["amount"] for r in stripe.refunds] == [100]
        assert json.loads(mcp_server.received[-1]) == json.loads(plain)
    finally:
        http.close()


def test_another_api_on_the_mcp_host_is_not_passed_as_no_tool_call(
    sc: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], mcp_server: FakeStripeMcp
) -> None:
    # A server that also serves a REST API beside its MCP endpoint: a JSON POST that is not
    # JSON-RPC, or a DELETE that ends no session, is that API's write, not MCP traffic.
    http, headers = _session(mcp_server.url, sc.proxy_url)
    try:
        before = len(mcp_server.received)
        got = http.post(
            f"{mcp_server.url}/v1/refunds",
            content=b'{"payment_intent":"pi_1","amount":900000}',
            headers=headers,
        )
        assert got.headers.get("x-ctrlrun-outcome") == "invalid_request", got.text
        assert len(mcp_server.received) == before
        bare = {k: v for k, v in headers.items() if k != "Mcp-Session-Id"}
        got = http.delete(f"{mcp_server.url}/v1/customers/cus_1", headers=bare)
        assert got.headers.get("x-ctrlrun-outcome") == "invalid_request", got.text
        # The session's own DELETE still ends it.
        got = http.delete(mcp_server.url, headers=headers)
        assert got.headers.get("x-ctrlrun-outcome") is None and got.status_code < 300, got.text
    finally:
        http.close()
