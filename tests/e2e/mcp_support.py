"""Helpers for the MCP end-to-end tests: a sidecar guarding the fake Stripe MCP server (and
the fake Stripe's REST side), and the official ``mcp`` client pointed at it through the
sidecar in explicit mode."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from harness import STRIPE_KEY, Sidecar, start_sidecar
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from ctrlrun.testing import FakeKubernetes, FakeStripe
from ctrlrun.testing.stripe_mcp import FakeStripeMcp

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{{{{account}}}}:{{{{payment_id}}}}"
    rules:
      - when: {{{{amount_lte: 100000}}}}
        decision: allow
      - decision: approve
  stripe.payout:
    decision: deny
upstreams:
  stripe:
    profile: stripe
    url: {{stripe}}
    listen: 127.0.0.1:{{stripe_port}}
    api_key_env: STRIPE_E2E_KEY
    timeout: {{timeout}}
    reconcile: {{reconcile}}
  stripe-mcp:
    profile: stripe-mcp
    url: {mcp}
    api_url: {{stripe}}
    api_key_env: STRIPE_E2E_KEY
    timeout: {{timeout}}
    reconcile: {{reconcile}}
"""
HEADERS = {"Authorization": f"Bearer {STRIPE_KEY}"}


def start_mcp_sidecar(
    workdir: Path, stripe: FakeStripe, kube: FakeKubernetes, server: FakeStripeMcp, **kw: Any
) -> Sidecar:
    text = POLICY.format(mcp=server.url)
    return start_sidecar(workdir, stripe, kube, policy_text=text, in_process=True, **kw)


@asynccontextmanager
async def session(url: str, proxy: str | None) -> AsyncIterator[ClientSession]:
    """The official client's session, through ``proxy`` (explicit mode) when given."""

    client = httpx.AsyncClient(headers=HEADERS, timeout=30, proxy=proxy, trust_env=False)
    async with (
        client,
        streamable_http_client(url, http_client=client) as (r, w, _),
        ClientSession(r, w) as s,
    ):
        await s.initialize()
        yield s


def text(result: CallToolResult) -> str:
    assert len(result.content) == 1, result
    first = result.content[0]
    assert first.type == "text"
    return first.text


def receipt_meta(result: CallToolResult) -> dict[str, Any]:
    meta = result.meta or {}
    block = meta["com.ctrlrun/receipt"]
    assert isinstance(block, dict)
    return block


def ledger_json(sc: Sidecar) -> list[dict[str, Any]]:
    """``ctrlrun receipts --json``: receipts and, between them, reconciliation events."""
    out = sc.cli("receipts", "--json", "--store-url", sc.store_url)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]
