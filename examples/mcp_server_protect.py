"""@ctrlrun.protect on the tools of your own MCP server (the official ``mcp`` SDK's FastMCP).

    pip install 'ctrlrun[mcp]'
    python examples/mcp_server_protect.py

A team that runs its own MCP server gets the sidecar's guarantees in-process: the tool's
effect happens at most once, as the policy allows, with a receipt. A refusal becomes a tool
error whose text starts with ``ctrlrun:``, which the agent's model reads. Here the refund
really goes to a fake Stripe on loopback; the first reply is lost, the reconciler finds the
refund, and the agent's retry is refused.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import httpx
from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.shared.memory import create_connected_server_and_client_session

import ctrlrun
from ctrlrun import Control, Policy, SQLiteStateStore
from ctrlrun.reconcilers import stripe_refunds
from ctrlrun.testing import FakeStripe

KEY = "sk_test_example"
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: {amount_lte: 10000}
        decision: allow
      - decision: deny
"""


def build_server(stripe_url: str, control: Control) -> FastMCP:
    """The MCP server: one tool, whose effect is protected."""
    server = FastMCP("billing")

    @ctrlrun.protect(
        "stripe.refund",
        effect="refund:{payment_id}",
        reconcile=stripe_refunds(api_key=KEY, base_url=stripe_url),
        reconcile_eagerly=True,
        control=control,
    )
    async def refund_once(payment_id: str, amount: int) -> str:
        async with httpx.AsyncClient() as client:
            reply = await client.post(
                f"{stripe_url}/v1/refunds",
                data={"payment_intent": payment_id, "amount": str(amount)},
                headers={
                    "Authorization": f"Bearer {KEY}",
                    "Idempotency-Key": ctrlrun.idempotency_token(),
                },
            )
        return reply.text

    @server.tool()
    async def refund(payment_id: str, amount: int) -> str:
        """Refund ``amount`` (minor units) of a payment."""
        with ctrlrun.context(agent="billing-mcp"):
            try:
                return await refund_once(payment_id=payment_id, amount=amount)
            except ctrlrun.CTRLRunError as exc:  # the model reads this tool error
                raise ToolError(f"ctrlrun: {exc}") from exc
            except httpx.HTTPError as exc:
                raise ToolError(f"the reply was lost ({type(exc).__name__})") from exc

    return server


async def agent(server: FastMCP, payment: str) -> None:
    async with create_connected_server_and_client_session(server) as session:
        for _ in range(2):
            result = await session.call_tool("refund", {"payment_id": payment, "amount": 2500})
            first = result.content[0]
            print("error:" if result.isError else "ok:", getattr(first, "text", "")[:120])
        too_much = await session.call_tool("refund", {"payment_id": payment, "amount": 50_000})
        print("error:" if too_much.isError else "ok:", getattr(too_much.content[0], "text", ""))


def main() -> None:
    with FakeStripe() as stripe, tempfile.TemporaryDirectory() as tmp:
        payment = str(stripe.add_payment_intent(amount=90_000)["id"])
        control = Control(Policy.from_yaml(POLICY), SQLiteStateStore(Path(tmp) / "state.db"))
        stripe.fail_next("commit_then_drop")  # the first refund is made, its reply lost
        asyncio.run(agent(build_server(stripe.url, control), payment))
        print("refunds at Stripe:", len(stripe.refunds))
        control.store.close()


if __name__ == "__main__":
    main()
