"""stripe-agent-toolkit 0.7 (the package agent frameworks use for Stripe; every tool call is
a JSON-RPC ``tools/call`` to Stripe's MCP server) through the sidecar in explicit mode
(``HTTP_PROXY``), pointed at the fake Stripe MCP server."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import STRIPE_KEY, Sidecar
from mcp_support import ledger_json, start_mcp_sidecar
from stripe_agent_toolkit.shared import McpTool, ToolkitCore, mcp_client
from stripe_agent_toolkit.shared.constants import VERSION

from ctrlrun.testing import FakeKubernetes, FakeStripe
from ctrlrun.testing.stripe_mcp import FakeStripeMcp

pytestmark = pytest.mark.timeout(120)
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")


class Toolkit(ToolkitCore[list[McpTool]]):
    """The toolkit's own core, as each framework adapter subclasses it (tools left as MCP's)."""

    def _empty_tools(self) -> list[McpTool]:
        return []

    def _convert_tools(self, mcp_tools: list[McpTool]) -> list[McpTool]:
        return list(mcp_tools)


@pytest.fixture
def mcp_server(fakes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[FakeStripeMcp]:
    with FakeStripeMcp(fakes[0]) as server:
        yield server


@pytest.fixture
def sc(
    tmp_path: Path,
    fakes: tuple[FakeStripe, FakeKubernetes],
    mcp_server: FakeStripeMcp,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Sidecar]:
    sidecar = start_mcp_sidecar(tmp_path, fakes[0], fakes[1], mcp_server)
    for name in (*PROXY_VARIABLES, "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", sidecar.proxy_url)  # explicit mode, as documented
    # The toolkit always asks https://mcp.stripe.com; here it asks the fake instead.
    monkeypatch.setattr(mcp_client, "MCP_SERVER_URL", mcp_server.url)
    yield sidecar
    sidecar.stop()


def run(toolkit: Toolkit, tool: str, **arguments: Any) -> str:
    async def go() -> str:
        await toolkit.initialize()
        return await toolkit.run_tool(tool, arguments)

    return asyncio.run(go())


def surfaced(exc: BaseException) -> str:
    """The tool error's text as the toolkit raises it.

    0.7 raises ``RuntimeError(text)`` inside its session's task group, so what reaches the
    caller is ``RuntimeError("Failed to execute tool ...")`` from (nested) exception groups
    whose one leaf carries the text (the same for Stripe's own tool errors).
    """
    inner = exc.__cause__
    while isinstance(inner, BaseExceptionGroup):
        (inner,) = inner.exceptions
    assert inner is not None, repr(exc)
    text = str(inner)
    assert text.startswith("ctrlrun: "), text
    return text


def test_toolkit_initializes_refunds_once_and_surfaces_ctrlrun_refusals(
    sc: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], mcp_server: FakeStripeMcp
) -> None:
    assert VERSION.startswith("0.7.")
    stripe = fakes[0]
    pi = stripe.add_payment_intent(amount=5000)["id"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # it recommends rk_ keys over sk_ ones
        toolkit = Toolkit(STRIPE_KEY)

    asyncio.run(toolkit.initialize())
    names = {t["name"] for t in toolkit.get_tools()}
    assert {"create_refund", "create_payout", "list_refunds"} <= names

    made = run(toolkit, "create_refund", payment_intent=pi, amount=900)
    assert '"object":"refund"' in made
    with pytest.raises(RuntimeError) as again:
        run(toolkit, "create_refund", payment_intent=pi, amount=900)
    assert "already happened" in surfaced(again.value)
    with pytest.raises(RuntimeError) as payout:
        run(toolkit, "create_payout", amount=100)
    assert "policy" in surfaced(payout.value)

    assert len(stripe.refunds) == 1 and stripe.payouts == []
    assert not any(b"create_payout" in body for body in mcp_server.received)  # reached nothing
    results = [(r["action"], r["result"]) for r in ledger_json(sc) if r["kind"] == "receipt"]
    assert results == [
        ("stripe.refund", "committed"),
        ("stripe.refund", "blocked"),
        ("stripe.payout", "denied"),
    ]
