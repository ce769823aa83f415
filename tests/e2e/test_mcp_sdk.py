"""The SDK side of MCP: ``examples/mcp_server_protect.py``, an MCP server on the official
``mcp`` SDK whose tool is ``@ctrlrun.protect``-ed, called by the official client."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from mcp.shared.memory import create_connected_server_and_client_session

from ctrlrun import Control, Policy, SQLiteStateStore, ledger
from ctrlrun.testing import FakeStripe

pytestmark = pytest.mark.timeout(120)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mcp_server_protect.py"


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mcp_server_protect", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_protected_tool_runs_once_and_refusals_are_ctrlrun_tool_errors(tmp_path: Path) -> None:
    mod = example()
    with FakeStripe() as stripe:
        payment = str(stripe.add_payment_intent(amount=90_000)["id"])
        control = Control(Policy.from_yaml(mod.POLICY), SQLiteStateStore(tmp_path / "s.db"))
        server = mod.build_server(stripe.url, control)
        stripe.fail_next("commit_then_drop")

        async def agent() -> list[tuple[bool, str]]:
            out = []
            async with create_connected_server_and_client_session(server) as session:
                for amount in (2500, 2500, 50_000):
                    args = {"payment_id": payment, "amount": amount}
                    result = await session.call_tool("refund", args)
                    out.append((result.isError, result.content[0].text))  # type: ignore[union-attr]
            return out

        lost, retry, denied = asyncio.run(agent())
        assert lost[0] and "reply was lost" in lost[1]
        assert retry[0] and "ctrlrun: " in retry[1] and "already committed" in retry[1]
        assert denied[0] and "ctrlrun: stripe.refund denied" in denied[1]
        assert len(stripe.refunds) == 1
        with control.store.reading() as conn:
            record = ledger.get_effect(conn, f"refund:{payment}")
        assert record is not None and record.state.value == "committed"  # reconciled eagerly
        control.store.close()


def test_the_example_runs() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "refunds at Stripe: 1" in result.stdout
    assert result.stdout.count("error: ") == 3
