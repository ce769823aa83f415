"""The fake Stripe MCP server: the official SDK's server over a FakeStripe's state, failing
on demand."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ctrlrun.testing import FakeStripe
from ctrlrun.testing.stripe_mcp import FakeStripeMcp

pytestmark = pytest.mark.timeout(60)
KEY = "sk_test_fake_mcp"
INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}


@pytest.fixture
def fake() -> Iterator[tuple[FakeStripe, FakeStripeMcp]]:
    with FakeStripe() as stripe, FakeStripeMcp(stripe, json_response=True) as server:
        yield stripe, server


def session(server: FakeStripeMcp, key: str = KEY) -> tuple[httpx.Client, dict[str, str]]:
    http = httpx.Client(trust_env=False, timeout=20)
    headers = {"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream"}
    got = http.post(server.url, json=INIT, headers=headers)
    assert got.status_code == 200, got.text
    headers["Mcp-Session-Id"] = got.headers["mcp-session-id"]
    http.post(
        server.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
    )
    return http, headers


def refund(http: httpx.Client, headers: dict[str, str], url: str, pi: str) -> httpx.Response:
    params: dict[str, Any] = {
        "name": "create_refund",
        "arguments": {"payment_intent": pi, "amount": 100},
    }
    return http.post(
        url,
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params},
        headers=headers,
    )


def test_a_refund_made_through_mcp_is_in_the_rest_state(
    fake: tuple[FakeStripe, FakeStripeMcp],
) -> None:
    stripe, server = fake
    pi = stripe.add_payment_intent(amount=500)["id"]
    http, headers = session(server)
    result = refund(http, headers, server.url, pi).json()["result"]
    assert (
        not result.get("isError") and json.loads(result["content"][0]["text"])["object"] == "refund"
    )
    assert [r["payment_intent"] for r in stripe.refunds] == [pi]
    assert stripe.writes_applied == 1


def test_stripe_refusals_and_keys(fake: tuple[FakeStripe, FakeStripeMcp]) -> None:
    stripe, server = fake
    http, headers = session(server, key="rk_wrong")
    result = refund(http, headers, server.url, "pi_none").json()["result"]
    assert result["isError"] and "Invalid API Key" in result["content"][0]["text"]
    http, headers = session(server)
    result = refund(http, headers, server.url, "pi_none").json()["result"]
    assert result["isError"] and "No such payment_intent" in result["content"][0]["text"]
    assert stripe.refunds == []


@pytest.mark.parametrize(
    ("mode", "refunds"),
    [("commit_then_drop", 1), ("commit_then_500", 1), ("tool_error", 0), (503, 0)],
)
def test_failures(fake: tuple[FakeStripe, FakeStripeMcp], mode: Any, refunds: int) -> None:
    stripe, server = fake
    pi = stripe.add_payment_intent(amount=500)["id"]
    http, headers = session(server)
    server.fail_next(mode)
    if mode == "commit_then_drop":
        with pytest.raises(httpx.HTTPError):
            refund(http, headers, server.url, pi)
    else:
        got = refund(http, headers, server.url, pi)
        if mode == "tool_error":
            assert got.json()["result"]["isError"]
        else:
            assert got.status_code == (500 if mode == "commit_then_500" else 503)
    assert len(stripe.refunds) == refunds
    assert not refund(http, headers, server.url, pi).json()["result"].get("isError")  # once


def test_hang_then_cut(fake: tuple[FakeStripe, FakeStripeMcp]) -> None:
    stripe, server = fake
    server.hang_seconds = 0.5
    pi = stripe.add_payment_intent(amount=500)["id"]
    http, headers = session(server)
    server.fail_next("hang")
    with pytest.raises(httpx.HTTPError):
        refund(http, headers, server.url, pi)
    assert stripe.refunds == []


def test_unknown_modes_are_refused(fake: tuple[FakeStripe, FakeStripeMcp]) -> None:
    for mode in ("explode", 200, 99):
        with pytest.raises(ValueError):
            fake[1].fail_next(mode)  # type: ignore[arg-type]
