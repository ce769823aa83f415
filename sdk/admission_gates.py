"""The gates admission passes before an attempt's record: the kill switch, the decision, the budget.

Pure functions from ``Facts`` to the plan of an attempt they refuse, or to the budget write of
one they let through; ``admission.plan_admission`` calls them in its order (see there).
"""

from __future__ import annotations

from .budgets import BudgetCharge
from .events import EventType as E
from .plan import (
    ConsumeBudget,
    Facts,
    NewEvent,
    Plan,
    ReceiptSpec,
    Refusal,
    RefusalKind,
    Verdict,
)


def past_limit(f: Facts) -> str | None:
    """Why a human is asked: the budget says ``over: approve`` and this attempt is past it."""
    b = f.budget
    if b is None or b.over != "approve" or b.charge is None or (b.spent or 0) + b.charge <= b.max:
        return None
    return f"{b.action}: past its budget ({b.rule}): {b.left()} left, this asks {b.charge}"


def would_have(f: Facts, blocked: str) -> dict[str, str]:
    ev = f.evaluation
    return {"decision": ev.decision.value, "reason": ev.reason, "blocked_reason": blocked}


def frozen(f: Facts, head: tuple[NewEvent, ...], why: str) -> Plan:
    return _blocked(f, head, Verdict.FROZEN, "frozen", "frozen", why)


def _blocked(
    f: Facts,
    head: tuple[NewEvent, ...],
    verdict: Verdict,
    kind: RefusalKind,
    reason: str,
    why: str,
) -> Plan:
    """A gate before the record refused the attempt: denied, with a ``blocked`` receipt."""
    a = f.action
    denied = NewEvent(
        E.ACTION_DENIED, a.action_id, f.effect_key, data={"reason": reason, "detail": why}
    )
    return Plan(
        verdict,
        (*head, denied),
        receipt=ReceiptSpec("blocked", why),
        refusal=Refusal(kind, reason, why, action_id=a.action_id),
    )


def budget_write(f: Facts, *, approved: bool) -> ConsumeBudget | str | None:
    """The budget write this attempt makes, or why it is refused; None: it has no budget.

    ``approved``: an operator approved it, so with ``over: approve`` it spends past the limit.
    """
    b = f.budget
    if b is None:
        return None
    if b.charge is None:
        return f"{b.action}: its budget ({b.rule}) cannot measure this request"
    if (b.spent or 0) + b.charge > b.max and not (approved and b.over == "approve"):
        return f"{b.action}: budget exceeded ({b.rule}): {b.left()} left, this asks {b.charge}"
    return ConsumeBudget(b, BudgetCharge(b.action, b.scope, b.window_start, b.charge))


def over_budget(f: Facts, head: tuple[NewEvent, ...], why: str) -> Plan:
    return _blocked(f, head, Verdict.BUDGET_EXCEEDED, "budget", "budget_exceeded", why)


def deny(f: Facts, head: tuple[NewEvent, ...]) -> Plan:
    a, reason = f.action, f.evaluation.reason
    denied = NewEvent(E.ACTION_DENIED, a.action_id, f.effect_key, data={"reason": reason})
    return Plan(
        Verdict.DENY,
        (*head, denied),
        receipt=ReceiptSpec("denied"),
        refusal=Refusal("denied", reason, f"{a.name} denied: {reason}", action_id=a.action_id),
    )
