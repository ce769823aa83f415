"""MCP bodies a server may read as another tool call than ctrlrun does, through the sidecar.

Go's encoding/json (which the Go MCP SDKs use) matches keys without regard to case and lets
the last of two such keys win: ``"Method": "tools/call"`` is a tool call there, and
``{"amount": 100, "Amount": 900000}`` an amount of 900000. Each of these bodies must be refused
with nothing forwarded, and no refund made.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx
import pytest
from harness import STRIPE_KEY, Sidecar
from mcp_support import session

from ctrlrun.testing import FakeKubernetes, FakeStripe
from ctrlrun.testing.stripe_mcp import FakeStripeMcp

pytestmark = pytest.mark.timeout(120)
INIT = (
    b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
    b'"capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}'
)


@pytest.fixture
def sc(mcp_sidecar: Sidecar) -> Sidecar:
    return mcp_sidecar  # the conftest's, in front of its mcp_server


def _session(url: str, proxy: str | None) -> tuple[httpx.Client, dict[str, str]]:
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
        assert got.json()["id"] == 5, got.text
        assert [r["amount"] for r in stripe.refunds] == [100]
        sent = json.loads(mcp_server.received[-1])
        assert sent["id"].startswith("ctrlrun-")  # the call goes under an id of ctrlrun's own
        assert {**sent, "id": 5} == json.loads(plain)
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


def _deletes(server: FakeStripeMcp) -> list[str]:
    return [path for method, path in server.requests if method == "DELETE"]


def _refused(got: httpx.Response, why: str) -> None:
    assert got.status_code == 400, got.text
    assert got.headers.get("x-ctrlrun-outcome") == "invalid_request", got.text
    message = got.json()["error"]["message"]
    assert message.startswith("ctrlrun: ") and why in message, message


def test_a_delete_naming_a_session_id_on_another_path_is_refused_and_never_forwarded(
    sc: Sidecar, mcp_server: FakeStripeMcp
) -> None:
    # The fake's MCP endpoint is "/"; anything else on its host is another API's.
    http, headers = _session(mcp_server.url, sc.proxy_url)
    try:
        made_up = {**headers, "Mcp-Session-Id": "x"}
        got = http.delete(f"{mcp_server.url}/v1/customers/cus_1", headers=made_up)
        _refused(got, "did not see the server assign on /v1/customers/cus_1")
        # The session's real id, on a path the server did not assign it on.
        for path in ("/v1/customers/cus_1", "//", "/v1/customers/cus_1?x=/"):
            got = http.delete(f"{mcp_server.url}{path}", headers=headers)
            _refused(got, "did not see the server assign on /")
        # A made-up id, or the real one in another case, on the endpoint's own path.
        got = http.delete(mcp_server.url, headers=made_up)
        _refused(got, "did not see the server assign on /")
        upper = {**headers, "Mcp-Session-Id": headers["Mcp-Session-Id"].upper()}
        _refused(http.delete(mcp_server.url, headers=upper), "did not see the server assign")
        assert _deletes(mcp_server) == []
        # The session still works: nothing ended it.
        ping = b'{"jsonrpc":"2.0","id":3,"method":"ping"}'
        assert http.post(mcp_server.url, content=ping, headers=headers).status_code == 200
    finally:
        http.close()


def test_the_session_delete_on_its_endpoint_passes_once(
    sc: Sidecar, mcp_server: FakeStripeMcp
) -> None:
    http, headers = _session(mcp_server.url, sc.proxy_url)
    try:
        got = http.delete(mcp_server.url, headers=headers)
        assert got.status_code == 200 and got.headers.get("x-ctrlrun-outcome") is None, got.text
        assert _deletes(mcp_server) == ["/"]
        # Ended, so forgotten: the same DELETE again is no longer a known session's end.
        _refused(http.delete(mcp_server.url, headers=headers), "did not see the server assign")
        assert _deletes(mcp_server) == ["/"]
        # Another session on the same endpoint is its own.
        _, second = _session(mcp_server.url, sc.proxy_url)
        assert second["Mcp-Session-Id"] != headers["Mcp-Session-Id"]
        assert http.delete(mcp_server.url, headers=second).status_code == 200
        assert _deletes(mcp_server) == ["/", "/"]
    finally:
        http.close()


@pytest.mark.parametrize("refund", [False, True])
def test_the_official_client_ends_its_session_through_the_proxy(
    sc: Sidecar,
    fakes: tuple[FakeStripe, FakeKubernetes],
    mcp_server: FakeStripeMcp,
    caplog: pytest.LogCaptureFixture,
    refund: bool,
) -> None:
    # Without a tool call every answer naming the session passed through mitmproxy; with one,
    # ctrlrun forwarded that call itself and read its answer.
    pi = fakes[0].add_payment_intent(amount=5000)["id"]

    async def agent() -> None:
        async with session(mcp_server.url, sc.proxy_url) as s:
            assert (await s.list_tools()).tools
            if refund:
                got = await s.call_tool("create_refund", {"payment_intent": pi, "amount": 100})
                assert not got.isError, got

    with caplog.at_level(logging.DEBUG, logger="mcp"):
        asyncio.run(agent())  # streamable_http_client sends the session's DELETE on exit
    assert _deletes(mcp_server) == ["/"]
    assert "Session termination failed" not in caplog.text
    assert len(fakes[0].refunds) == int(refund)


PING = '{"jsonrpc":"2.0","id":7,"method":"ping"}'
PAYOUT = '{"name":"create_payout","arguments":{"amount":100}}'


@pytest.mark.parametrize(
    "body",
    [
        _call(REFUND.format(pi="{pi}", extra="")),  # one call, forwarded by ctrlrun
        b"[" + _call(REFUND.format(pi="{pi}", extra="")) + b"]",  # a batch's call
        f"[{PING},".encode() + _call(PAYOUT) + b"]",  # a batch's other message (payout denied)
    ],
)
def test_a_session_is_learned_from_the_answers_ctrlrun_forwards_itself(
    sc: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], mcp_server: FakeStripeMcp, body: bytes
) -> None:
    # Opened straight at the server: the proxy first hears of the session in the server's
    # answer to a POST that ctrlrun forwarded itself (each message of a batch on its own).
    direct, headers = _session(mcp_server.url, None)
    http = httpx.Client(proxy=sc.proxy_url, trust_env=False, timeout=30)
    try:
        _refused(http.delete(mcp_server.url, headers=headers), "did not see the server assign")
        pi = fakes[0].add_payment_intent(amount=5000)["id"]
        got = http.post(mcp_server.url, content=body.replace(b"{pi}", pi.encode()), headers=headers)
        assert got.status_code == 200, got.text
        assert http.delete(mcp_server.url, headers=headers).status_code == 200
        assert _deletes(mcp_server) == ["/"]
    finally:
        http.close()
        direct.close()
