"""MCP tool calls whose server fails (hangs, answers 500 after committing, answers a tool
error), and a ``profile: mcp`` upstream with its own ``tools:`` and ``unmapped_tools: allow``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Sidecar, running_sidecar
from mcp_support import POLICY, ledger_json
from test_mcp_wire import Raw, call

from ctrlrun.testing import FakeKubernetes, FakeStripe
from ctrlrun.testing.stripe_mcp import FakeStripeMcp

pytestmark = pytest.mark.timeout(120)
GENERIC = """\
  billing:
    profile: mcp
    url: {url}
    unmapped_tools: allow
    tools:
      refund_payment:
        action: stripe.refund
        arguments:
          {{{{payment_id: payment_intent, payment_intent: payment_intent, amount: amount}}}}
        effect: "billing-refund:{{{{payment_id}}}}"
"""


@pytest.fixture
def servers(fakes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[tuple[FakeStripeMcp, ...]]:
    with (
        FakeStripeMcp(fakes[0], json_response=True, hang_seconds=8) as stripe_mcp,
        FakeStripeMcp(fakes[0], json_response=True) as generic,
    ):
        yield stripe_mcp, generic


@pytest.fixture
def sc(
    tmp_path: Path,
    fakes: tuple[FakeStripe, FakeKubernetes],
    servers: tuple[FakeStripeMcp, FakeStripeMcp],
) -> Iterator[Sidecar]:
    text = POLICY.format(mcp=servers[0].url) + GENERIC.format(url=servers[1].url)
    with running_sidecar(tmp_path, *fakes, policy_text=text, in_process=True) as sidecar:
        yield sidecar


def refund(raw: Raw, rid: int, pi: str, name: str = "create_refund") -> dict[str, Any]:
    got = raw.post(json.dumps(call(rid, name, payment_intent=pi, amount=600)).encode())
    assert got.status_code == 200, got.text
    result: dict[str, Any] = got.json()["result"]
    return result


def meta(result: dict[str, Any]) -> dict[str, Any]:
    block: dict[str, Any] = result["_meta"]["com.ctrlrun/receipt"]
    return block


def test_a_hang_is_ambiguous_and_a_retry_is_refused_until_it_is_settled(
    sc: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], servers: tuple[FakeStripeMcp, ...]
) -> None:
    pi = fakes[0].add_payment_intent(amount=5000)["id"]
    raw = Raw(servers[0].url, sc.proxy_url)
    raw.open()
    servers[0].fail_next("hang")
    hung = refund(raw, 1, pi)
    assert (meta(hung)["outcome"], meta(hung)["reason"]) == (
        "upstream_ambiguous",
        "reconciler: unknown",
    )
    retry = refund(raw, 2, pi)
    assert (
        meta(retry)["outcome"] == "ambiguous" and "ctrlrun resolve" in retry["content"][0]["text"]
    )
    assert fakes[0].refunds == []
    key = f"refund:{fakes[0].platform_id}:{pi}"
    assert sc.cli("resolve", key, "--failed", "--store-url", sc.store_url).returncode == 0
    assert not refund(raw, 3, pi).get("isError")  # a failed record permits a renewal
    assert len(fakes[0].refunds) == 1


def test_a_500_after_committing_is_reconciled_committed(
    sc: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], servers: tuple[FakeStripeMcp, ...]
) -> None:
    pi = fakes[0].add_payment_intent(amount=5000)["id"]
    raw = Raw(servers[0].url, sc.proxy_url)
    raw.open()
    servers[0].fail_next("commit_then_500")
    lost = refund(raw, 1, pi)
    assert meta(lost)["reason"] == "reconciler: committed"
    assert meta(refund(raw, 2, pi))["outcome"] == "duplicate"
    assert len(fakes[0].refunds) == 1


def test_a_tool_error_reaches_the_agent_and_the_record_is_ambiguous(
    sc: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], servers: tuple[FakeStripeMcp, ...]
) -> None:
    pi = fakes[0].add_payment_intent(amount=5000)["id"]
    raw = Raw(servers[0].url, sc.proxy_url)
    raw.open()
    servers[0].fail_next("tool_error")
    failed = refund(raw, 1, pi)
    assert failed["isError"] and "told to answer" in failed["content"][0]["text"]  # the remote's
    assert (
        sc.effect_state(f"refund:{fakes[0].platform_id}:{pi}") == "ambiguous"
    )  # the tool may have acted


def test_own_tools_table_and_unmapped_tools_allow(
    sc: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], servers: tuple[FakeStripeMcp, ...]
) -> None:
    stripe = fakes[0]
    pi = stripe.add_payment_intent(amount=5000)["id"]
    raw = Raw(servers[1].url, sc.proxy_url)
    raw.open()
    # create_refund is not in this upstream's tools: allowed unmapped, with a receipt
    assert not refund(raw, 1, pi).get("isError")
    # refund_payment is in them: decided as stripe.refund under the tool's own effect template
    # (and forwarded: this server has no such tool, and says so with a tool error)
    mapped = raw.post(json.dumps(call(4, "refund_payment", payment_intent=pi, amount=1)).encode())
    assert "Unknown tool" in mapped.json()["result"]["content"][0]["text"]
    assert sc.effect_state(f"billing-refund:{pi}") == "ambiguous"
    near = refund(raw, 2, pi, "Refund_Payment")  # spelt like a tool the map decides
    assert meta(near)["outcome"] == "invalid_request"
    listed = raw.post(json.dumps(call(3, "list_refunds", payment_intent=pi)).encode()).json()
    assert not listed["result"].get("isError")
    receipts = [(r["action"], r["result"]) for r in ledger_json(sc) if r["kind"] == "receipt"]
    assert sorted(receipts) == [
        ("billing.unmapped_tool", "committed"),
        ("billing.unmapped_tool", "committed"),
        ("stripe.refund", "ambiguous"),
    ]
    assert len(stripe.refunds) == 1


def test_reconcile_asks_stripes_rest_api_about_an_mcp_refund(
    tmp_path: Path,
    fakes: tuple[FakeStripe, FakeKubernetes],
    servers: tuple[FakeStripeMcp, FakeStripeMcp],
) -> None:
    """Lazy reconciliation: the lost reply stays ambiguous until ``ctrlrun reconcile`` asks,
    with the upstream's api_key_env, at its api_url (the sidecar holds no request then)."""
    stripe = fakes[0]
    text = POLICY.format(mcp=servers[0].url)
    with running_sidecar(
        tmp_path, *fakes, policy_text=text, in_process=True, reconcile="lazy"
    ) as sc:
        pi = stripe.add_payment_intent(amount=5000)["id"]
        raw = Raw(servers[0].url, sc.proxy_url)
        raw.open()
        servers[0].fail_next("commit_then_drop")
        assert meta(refund(raw, 1, pi))["reason"] == "reconciler: not asked"
        key = f"refund:{fakes[0].platform_id}:{pi}"
        assert sc.effect_state(key) == "ambiguous"
        asked = sc.cli("reconcile", key, "--policy", str(sc.policy), "--store-url", sc.store_url)
        assert asked.returncode == 0, asked.stdout + asked.stderr
        assert sc.effect_state(key) == "committed"
        assert meta(refund(raw, 2, pi))["outcome"] == "duplicate"
        assert len(stripe.refunds) == 1
