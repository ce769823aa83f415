"""The cap on an agent's pending approval requests.

Every request the policy answers ``approve`` (or that a budget with ``over: approve`` asks
about, past its limit) leaves a request for a human. An agent in a loop
would bury the humans under them, so past ``limits.pending_approvals_per_agent`` unanswered,
unexpired requests of its own, a request that would ask for one more is refused instead,
saying the queue is full (with a receipt). A request for an action already waiting (the same
action hash, pending or granted) adds nothing and is let through to the kernel. Two requests
racing at the cap may both get in: the cap is exact to within the requests in flight.
"""

from __future__ import annotations

import asyncio
import json

from sqlalchemy import Connection, select

from ctrlrun import budgets
from ctrlrun.action import Action, iso
from ctrlrun.control import Control
from ctrlrun.schema import approvals

from .refusals import Refusal

REASON = "approval_queue_full"


def _crowded(ctl: Control, action: Action, cap: int, asks: bool) -> int | None:
    """How many requests the agent has waiting, when a new one would pass the cap.

    ``asks`` False: the action asks only past its budget (``over: approve``), so under it,
    as the budget's row reads now, nothing new would be asked.
    """
    now = iso(ctl.clock())
    stmt = select(approvals.c.action_hash, approvals.c.status, approvals.c.action_json).where(
        approvals.c.status.in_(("pending", "granted")), approvals.c.expires_at > now
    )
    waiting = 0
    with ctl.store.reading() as conn:
        if not asks and not _past_budget(conn, ctl, action):
            return None
        for action_hash, status, document in conn.execute(stmt):
            if action_hash == action.hash:
                return None  # a resend, or an answer already given: nothing new to ask
            if status == "pending":
                principal = json.loads(document).get("principal") or {}
                waiting += principal.get("agent") == action.principal.agent
    return waiting if waiting >= cap else None


def _past_budget(conn: Connection, ctl: Control, action: Action) -> bool:
    budget = ctl.policy.budget(action.name)
    if budget is None:
        return False
    ask = budgets.ask(budget, action.name, action.principal, action.arguments, ctl.clock())
    spent = budgets.spent_rows(conn, ask.action, ask.window_start).get(ask.scope, 0)
    return ask.charge is not None and spent + ask.charge > ask.max


async def queue_full(
    ctl: Control, action: Action, approval_id: str | None, cap: int
) -> Refusal | None:
    """A refusal when ``action`` would ask a human for one approval too many, else None."""
    if approval_id is not None:
        return None
    decision = ctl.evaluate(action).decision
    if decision != "approve" and not ctl.policy.may_ask(action.name, decision):
        return None
    waiting = await asyncio.to_thread(_crowded, ctl, action, cap, decision == "approve")
    if waiting is None:
        return None
    return Refusal(
        "denied",
        REASON,
        f"the approval queue of agent {action.principal.agent!r} is full ({waiting} requests "
        f"waiting, the limit is {cap}): ask a human to answer them before sending more",
        action=action.name,
    )
