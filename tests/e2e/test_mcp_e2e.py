"""The official ``mcp`` client through the sidecar (explicit mode) to the fake Stripe MCP
server: tool calls are decided, refused with a ``ctrlrun:`` tool error, and recorded; JSON
and SSE answers alike."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from harness import Sidecar
from mcp.types import CallToolResult
from mcp_support import ledger_json, receipt_meta, session, text

from ctrlrun.testing import FakeKubernetes, FakeStripe
from ctrlrun.testing.stripe_mcp import FakeStripeMcp

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["sse", "json"])
def mcp_server(
    request: pytest.FixtureRequest, fakes: tuple[FakeStripe, FakeKubernetes]
) -> Iterator[FakeStripeMcp]:
    with FakeStripeMcp(fakes[0], json_response=request.param == "json") as server:
        yield server


@pytest.fixture
def sc(mcp_sidecar: Sidecar) -> Sidecar:
    return mcp_sidecar  # the conftest's, in front of its mcp_server


def test_refund_once_then_duplicate_and_payout_denied(
    sc: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], mcp_server: FakeStripeMcp
) -> None:
    stripe = fakes[0]
    pi = stripe.add_payment_intent(amount=5000)["id"]

    async def agent() -> None:
        async with session(mcp_server.url, sc.proxy_url) as s:
            tools = {t.name for t in (await s.list_tools()).tools}
            assert {"create_refund", "create_payout", "list_refunds"} <= tools
            first = await s.call_tool("create_refund", {"payment_intent": pi, "amount": 500})
            assert not first.isError, first
            assert '"object":"refund"' in text(first)
            again = await s.call_tool("create_refund", {"payment_intent": pi, "amount": 500})
            assert again.isError
            assert text(again).startswith("ctrlrun: ")
            meta = receipt_meta(again)
            assert (
                meta["outcome"] == "duplicate"
                and meta["effect_key"] == f"refund:{fakes[0].platform_id}:{pi}"
            )
            assert meta["receipt_id"].startswith("ctr_")
            payout = await s.call_tool("create_payout", {"amount": 100})
            assert payout.isError and receipt_meta(payout)["outcome"] == "denied"
            listed = await s.call_tool("list_refunds", {"payment_intent": pi})
            assert not listed.isError and pi in text(listed)  # a read passes

    asyncio.run(agent())
    assert len(stripe.refunds) == 1
    assert stripe.payouts == []
    results = [(r["action"], r["result"]) for r in ledger_json(sc) if r["kind"] == "receipt"]
    assert results == [
        ("stripe.refund", "committed"),
        ("stripe.refund", "blocked"),
        ("stripe.payout", "denied"),
    ]


def test_lost_reply_is_reconciled_committed_in_the_same_call_and_the_retry_is_a_duplicate(
    sc: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], mcp_server: FakeStripeMcp
) -> None:
    stripe = fakes[0]
    pi = stripe.add_payment_intent(amount=5000)["id"]
    key = f"refund:{fakes[0].platform_id}:{pi}"
    mcp_server.fail_next("commit_then_drop")

    async def agent() -> None:
        async with session(mcp_server.url, sc.proxy_url) as s:
            lost = await s.call_tool("create_refund", {"payment_intent": pi, "amount": 700})
            assert lost.isError
            meta = receipt_meta(lost)
            assert (meta["outcome"], meta["reason"]) == (
                "upstream_ambiguous",
                "reconciler: committed",
            )
            assert "the reconciler found: committed" in text(lost)
            retry = await s.call_tool("create_refund", {"payment_intent": pi, "amount": 700})
            assert retry.isError and receipt_meta(retry)["outcome"] == "duplicate"

    asyncio.run(agent())
    assert len(stripe.refunds) == 1  # committed once, its reply lost, never sent again
    assert sc.effect_state(key) == "committed"
    rows = ledger_json(sc)
    events = [(e["type"], e["data"].get("outcome")) for e in rows if e["kind"] == "event"]
    assert ("RECONCILIATION_RESOLVED", "committed") in events
    assert [r["result"] for r in rows if r["kind"] == "receipt"] == ["ambiguous", "blocked"]


def test_approval_round_trip_the_identical_call_consumes_it(
    sc: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], mcp_server: FakeStripeMcp
) -> None:
    stripe = fakes[0]
    pi = stripe.add_payment_intent(amount=500_000)["id"]
    call = {"payment_intent": pi, "amount": 200_000}  # over the policy's allow limit

    async def ask(arguments: dict[str, object]) -> CallToolResult:
        async with session(mcp_server.url, sc.proxy_url) as s:
            return await s.call_tool("create_refund", arguments)

    asked = asyncio.run(ask(call))
    meta = receipt_meta(asked)
    assert asked.isError and meta["outcome"] == "approval_required"
    request_id = meta["request_id"]
    assert f"ctrlrun approve {request_id}" in text(asked)
    assert sc.cli("approve", request_id, "--store-url", sc.store_url).returncode == 0
    changed = asyncio.run(ask({**call, "amount": 200_001}))
    assert changed.isError and receipt_meta(changed)["outcome"] == "approval_required"
    done = asyncio.run(ask(call))
    assert not done.isError, text(done)
    assert len(stripe.refunds) == 1
