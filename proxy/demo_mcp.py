"""The MCP scene of ``ctrlrun demo``: an agent's refund through Stripe's MCP server (the fake),
whose reply is lost, reconciled by asking Stripe's REST API, and whose retry is refused.

The agent is the official ``mcp`` client; the fake server is on the ``mcp`` SDK too, so the
scene needs the ``mcp`` extra and is left out, saying so, without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctrlrun.testing import FakeStripe
    from ctrlrun.testing.stripe_mcp import FakeStripeMcp

UPSTREAM = """\
  stripe-mcp:
    profile: stripe-mcp
    url: {url}
    api_url: {stripe}
    api_key_env: CTRLRUN_DEMO_STRIPE_KEY
    listen: 127.0.0.1:{port}
    timeout: 5
"""


@contextlib.contextmanager
def fake(stripe: FakeStripe) -> Iterator[FakeStripeMcp | None]:
    """The fake Stripe MCP server over ``stripe``'s state, or None without the mcp extra."""
    try:
        from ctrlrun.testing.stripe_mcp import FakeStripeMcp
    except ImportError:
        yield None
        return
    # The SDK's server logs a traceback for each session the agent closes: not the demo's news.
    quiet = logging.getLogger("mcp")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        with FakeStripeMcp(stripe) as server:
            yield server
    finally:
        quiet.setLevel(level)


def upstream(server: FakeStripeMcp | None, stripe: FakeStripe, port: int) -> str:
    return "" if server is None else UPSTREAM.format(url=server.url, stripe=stripe.url, port=port)


def scene(
    base: str,
    server: FakeStripeMcp | None,
    stripe: FakeStripe,
    api_key: str,
    say: Callable[[str], None],
    check: Callable[[bool, str], None],
) -> None:
    say("5. An agent's refund through Stripe's MCP server, whose reply is lost")
    if server is None:
        say("   (left out: it needs the mcp extra, pip install 'ctrlrun[mcp]')")
        return
    pi = str(stripe.add_payment_intent(amount=40000)["id"])
    server.fail_next("commit_then_drop")
    lost, retry = asyncio.run(_agent(base, api_key, pi))
    say(
        f"   agent calls tool create_refund for 30.00 of {pi}: the server applied it, the "
        f"connection dropped -> {lost['outcome']}: {lost['reason']}"
    )
    say(f"   agent calls it again -> {retry['outcome']}: a ctrlrun: tool error the model reads")
    held = sum(1 for r in stripe.refunds if r.get("payment_intent") == pi)
    say(f"   Stripe holds {held} refund(s) for {pi}")
    ok = lost["reason"] == "reconciler: committed" and retry["outcome"] == "duplicate"
    check(ok and held == 1, "MCP refund count or retry")


async def _agent(base: str, api_key: str, pi: str) -> tuple[dict[str, Any], dict[str, Any]]:
    import httpx
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {api_key}"}
    arguments = {"payment_intent": pi, "amount": 3000}
    async with (
        httpx.AsyncClient(headers=headers, timeout=30, trust_env=False) as http,
        streamable_http_client(base, http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        results = [await session.call_tool("create_refund", arguments) for _ in range(2)]
    first, second = (dict((r.meta or {}).get("com.ctrlrun/receipt", {})) for r in results)
    return first, second
