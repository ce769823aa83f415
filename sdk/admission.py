"""Admission: what one attempt at an action gets, as a pure function from facts to a plan.

``plan_admission(facts)`` is everything ``Control.begin`` decides. The policy's evaluation,
the action and its effect key, the key's record, the presented approval's row, the clock,
the window, the mode, the lease and whether a reconcile hook may still be asked go in as
one frozen ``Facts``; one frozen ``Plan`` comes out, naming the verdict, the compare-and-set
writes, the events and the receipt that record it, and the refusal to raise once they are
committed (those values live in ``plan.py``; the gates before the record, in
``admission_gates.py``). ``writer.admit`` gathers the facts and applies the plan in one
transaction.

Verdicts (observe mode never refuses, but for a freeze: it plans ``RESERVE`` or ``RUN`` with
``would_have``)::

    FROZEN            an operator froze it (kill switch)   ACTION_DENIED, receipt blocked
    BUDGET_EXCEEDED   the action's budget: has too little  ACTION_DENIED, receipt blocked
    DENY              the policy says no                   ACTION_DENIED, receipt denied
    NEEDS_APPROVAL    approve, nothing presented           an approval request, no receipt
    APPROVAL_INVALID  the presented approval is unusable   receipt blocked (denied if denied)
    DUPLICATE         committed, inside its window if any  receipt blocked
    IN_PROGRESS       another attempt holds a live lease   receipt blocked
    AMBIGUOUS         nobody knows (an expired lease is ambiguated first)   receipt blocked
    RECONCILE_FIRST   ambiguous, and a hook may be asked: write the ambiguation, ask, plan again
    RESERVE           the key is ours (a new record or a renewal), the approval consumed
    RUN               execute holding no key: no effect key, or observe mode over a refusal

The checks run in this order: decision, approval, record. So a refusal never consumes an
approval, and the plan made with ``record=None`` is final unless it inserts a new record:
the writer inserts first and reads the record only when the insert finds the key taken.

New inputs slot in as fields of ``Facts`` and a branch here, not as new parameters: the
freeze switch, ``Facts.frozen``, is checked before the decision, a refusal with outcome
``frozen`` (receipt blocked) that needs no record, so the rule above still holds. A budget,
``Facts.budget`` (its row's spending, read locked in the same transaction), is checked before
the record: past its limit the plan is ``BUDGET_EXCEEDED`` (``ActionDenied`` reason
``budget_exceeded``, receipt blocked, no approval consumed, no record needed, so a duplicate
of a spent budget hears budget_exceeded); otherwise a ``RESERVE`` or ``RUN`` plan carries one
more compare-and-set write (``ConsumeBudget``) beside the approval's, so it is spent
atomically with the reservation and a lost race re-plans. Observe mode spends nothing and
notes ``budget_exceeded`` in ``would_have``. A budget with ``over: approve`` asks instead:
past its limit the attempt is planned as if the decision were ``approve`` (NEEDS_APPROVAL,
then a granted approval for that very action runs it and spends past the limit).

A standing approval (``Facts.resend``, unless the policy says ``approval: header``): with no
id presented, the writer looks up a granted, unconsumed approval for this very action hash
(the hash covers the principal) and passes it as ``Facts.approval``, consumed as if presented.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from . import admission_gates as gates
from .action import iso
from .admission_gates import past_limit
from .approvals import Approval, check_consumable
from .attempt import Attempt
from .events import EventType as E
from .plan import (
    ConsumeBudget,
    Facts,
    InsertApproval,
    InsertEffect,
    MoveApproval,
    MoveEffect,
    NewEvent,
    Plan,
    ReceiptSpec,
    Refusal,
    Verdict,
    Write,
)
from .policy import Decision
from .states import (
    LEASE_EXPIRED,
    LEASE_RAN_OUT,
    EffectState,
    Refuse,
    Reserve,
    SteadyNow,
    plan_reservation,
)
from .timestamps import stamp


@dataclass(frozen=True)
class _Taken:
    """A presented approval that this plan consumes."""

    approval: Approval
    write: MoveApproval
    event: NewEvent


def plan_admission(f: Facts) -> Plan:
    """What this attempt gets. Pure: the same facts always give the same plan."""
    head = () if f.announced else _announce(f)
    if f.frozen is not None:  # the kill switch holds in observe mode too
        return gates.frozen(f, head, f.frozen)
    decision, reason = f.evaluation.decision, f.evaluation.reason
    if f.mode == "observe":
        if decision is Decision.ALLOW:
            return _place(f, head, None, None)
        blocked = "approval_required" if decision is Decision.APPROVE else reason
        return _place(f, head, None, gates.would_have(f, blocked))
    if decision is Decision.DENY:
        return gates.deny(f, head)
    past = past_limit(f)  # over: approve, and past the limit: a human decides
    if decision is Decision.ALLOW and past is None:
        return _place(f, head, None, None)
    over = gates.budget_write(f, approved=True)
    if isinstance(over, str):  # no human is asked for what the budget refuses anyway
        return gates.over_budget(f, head, over)
    if f.approval_id is None:
        return _request(f, head, past)
    return _present(f, head, f.approval_id)


def wants_approval_row(f: Facts) -> bool:
    """Whether the plan reads the presented approval's row (the writer fetches it first)."""
    return f.approval_id is not None and _asks(f)


def wants_standing_approval(f: Facts) -> bool:
    """Whether the writer looks for a granted approval of this very action (none presented)."""
    return f.resend and f.approval_id is None and _asks(f)


def _asks(f: Facts) -> bool:
    """Whether an approval decides this attempt (its budget's spending already read)."""
    if f.mode != "enforce":
        return False
    return f.evaluation.decision is Decision.APPROVE or past_limit(f) is not None


def attempt_of(f: Facts, plan: Plan) -> Attempt:
    """The attempt a plan leaves: what ``Control.begin`` returns, or the refusal's receipt."""
    return Attempt(
        action=f.action,
        effect_key=f.effect_key,
        attempt=plan.attempt,
        decision=f.evaluation.decision.value,
        reason=f.evaluation.reason,
        policy_hash=f.policy_hash,
        started_at=f.started_at or f.now,
        approval=plan.approval,
        held=plan.held,
        would_have=plan.would_have,
        lease=f.lease,
        budget=next((w.charge for w in plan.writes if isinstance(w, ConsumeBudget)), None),
    )


def _announce(f: Facts) -> tuple[NewEvent, ...]:
    a, key, ev = f.action, f.effect_key, f.evaluation
    return (
        NewEvent(E.ACTION_PROPOSED, a.action_id, key, data={"action_hash": a.hash}),
        NewEvent(
            E.POLICY_EVALUATED,
            a.action_id,
            key,
            data={"decision": ev.decision.value, "reason": ev.reason},
        ),
    )


def _request(f: Facts, head: tuple[NewEvent, ...], past: str | None) -> Plan:
    a, request_id = f.action, f.request_id
    if f.pending_request is not None:  # asked again while pending: the same request
        return Plan(Verdict.NEEDS_APPROVAL, head, refusal=_asked(f, f.pending_request))
    if request_id is None:
        raise ValueError("an approval request needs Facts.request_id")
    expires = iso(f.now + f.approval_ttl)
    row = {
        "approval_id": request_id,
        "action_hash": a.hash,
        "status": "pending",
        "action_json": json.dumps(a.canonical_document(), sort_keys=True),
        "created_at": iso(f.now),
        "expires_at": expires,
        "policy_hash": f.policy_hash,
        "approvals_required": f.evaluation.approvals,
    }
    data: dict[str, Any] = {"action_hash": a.hash, "expires_at": expires}
    if f.evaluation.approvals > 1:
        data["approvals_required"] = f.evaluation.approvals
    if past is not None:
        data["budget"] = past
    requested = NewEvent(E.APPROVAL_REQUESTED, a.action_id, None, request_id, data)
    refusal = _asked(f, request_id)
    return Plan(Verdict.NEEDS_APPROVAL, (*head, requested), (InsertApproval(row),), refusal=refusal)


def _asked(f: Facts, request_id: str) -> Refusal:
    return Refusal(
        "approval_required", "approval_required", action_id=f.action.action_id,
        request_id=request_id, resend=f.resend,
    )  # fmt: skip


def _present(f: Facts, head: tuple[NewEvent, ...], approval_id: str) -> Plan:
    a, row = f.action, f.approval
    why = check_consumable(row, approval_id, a.hash, f.now)
    if why is None:
        assert row is not None
        approver = row["approver"]
        taken = _Taken(
            Approval(approval_id, a.hash, approver),
            MoveApproval(approval_id, "granted", "consumed", {"consumed_at": iso(f.now)}),
            NewEvent(E.APPROVAL_CONSUMED, a.action_id, None, approval_id, {"approver": approver}),
        )
        return _place(f, head, taken, None)
    writes: tuple[Write, ...] = ()
    if why == "expired" and row is not None and row["status"] == "granted":
        writes = (MoveApproval(approval_id, "granted", "expired"),)
        head = (*head, NewEvent(E.APPROVAL_EXPIRED, a.action_id, None, approval_id))
    if why == "denied":
        message = f"{a.name} denied: approval {approval_id} was denied"
        refusal = Refusal("denied", "approval_denied", message, action_id=a.action_id)
    else:
        refusal = Refusal("approval_invalid", why, request_id=approval_id)
    data = {"reason": refusal.reason, "action_hash": a.hash}
    invalidated = NewEvent(E.APPROVAL_INVALIDATED, a.action_id, f.effect_key, approval_id, data)
    result: Literal["denied", "blocked"] = "denied" if why == "denied" else "blocked"
    receipt = ReceiptSpec(result, str(refusal.error()), approval_id)
    return Plan(Verdict.APPROVAL_INVALID, (*head, invalidated), writes, receipt, refusal)


def _place(
    f: Facts,
    head: tuple[NewEvent, ...],
    taken: _Taken | None,
    would_have: Mapping[str, str] | None,
) -> Plan:
    """Run the attempt: on no key, on the key it may take, or refuse it by the key's record.

    A presented approval is consumed (its write and event) only by a plan that runs.
    """
    spend: tuple[Write, ...] = () if taken is None else (taken.write,)
    consumed: tuple[NewEvent, ...] = () if taken is None else (taken.event,)
    approval = None if taken is None else taken.approval
    budget = gates.budget_write(f, approved=taken is not None)
    if isinstance(budget, str):
        if f.mode != "observe":
            return gates.over_budget(f, head, budget)
        asks = "approval_required" if past_limit(f) else "budget_exceeded"
        would_have = would_have or gates.would_have(f, asks)
    elif budget is not None and f.mode != "observe":  # observe mode spends nothing
        spend = (*spend, budget)
    key = f.effect_key
    if key is None:
        started = NewEvent(E.EXECUTION_STARTED, f.action.action_id)
        events = (*head, *consumed, started)
        return Plan(Verdict.RUN, events, spend, approval=approval, would_have=would_have)
    steady = None if f.steady_now is None else SteadyNow(_clock(f.holder), f.steady_now)
    step = plan_reservation(f.record, f.now, f.window, steady)
    if isinstance(step, Refuse):
        return _refuse(f, key, head, step, would_have)
    return _reserve(f, key, (*head, *consumed), spend, step, approval, would_have)


def _reserve(
    f: Facts,
    key: str,
    head: tuple[NewEvent, ...],
    spend: tuple[Write, ...],
    step: Reserve,
    approval: Approval | None,
    would_have: Mapping[str, str] | None,
) -> Plan:
    a, now, number = f.action, stamp(f.now), step.attempt
    lease_ends = stamp(f.now + f.lease)
    values: dict[str, Any] = {
        "action_id": a.action_id,
        "attempt": number,
        "lease_expires_at": lease_ends,
        "lease_holder": f.holder,
        "lease_steady_until": _steady_end(f),
        "action_name": a.name,
        "action_json": a.canonical.decode("utf-8"),
        "idempotency_key": f.idempotency_key,
        "upstream": f.upstream,
        "updated_at": now,
        "attempt_started_at": now,
        "result_json": None,
        "error": None,
        "resolved_by": None,
        "committed_at": None,
        "committed_steady": None,  # this attempt's commit is yet to be read
        "committed_on": None,
    }
    take: Write
    if f.record is None:
        executing = EffectState.EXECUTING.value
        take = InsertEffect({**values, "effect_key": key, "state": executing, "created_at": now})
    else:
        rec = f.record
        take = MoveEffect(key, rec.state, EffectState.EXECUTING, rec.action_id, rec.attempt, values)
    data = {"attempt": number, "lease_expires_at": lease_ends}
    reserved = NewEvent(E.EFFECT_RESERVED, a.action_id, key, data=data)
    started = NewEvent(E.EXECUTION_STARTED, a.action_id, key)
    return Plan(
        Verdict.RESERVE,
        (*head, reserved, started),
        (take, *spend),
        attempt=number,
        approval=approval,
        would_have=would_have,
    )


def _steady_end(f: Facts) -> float | None:
    """The lease's end on this host's monotonic clock (holder.py)."""
    if f.holder is None or f.steady_now is None:
        return None
    return f.steady_now + f.lease.total_seconds()


def _clock(holder: str | None) -> str | None:
    """The monotonic clock a lease holder reads: its boot id and time namespace."""
    return None if holder is None else " ".join(holder.split(" ")[:2])


def _refuse(
    f: Facts,
    key: str,
    head: tuple[NewEvent, ...],
    step: Refuse,
    would_have: Mapping[str, str] | None,
) -> Plan:
    writes: tuple[Write, ...] = ()
    rec = f.record
    if step.ambiguate:
        # The holder's lease ran out: it may have acted, nobody knows. Say so first.
        assert rec is not None
        values = {"updated_at": stamp(f.now), **LEASE_RAN_OUT}
        writes = (
            MoveEffect(key, rec.state, EffectState.AMBIGUOUS, rec.action_id, rec.attempt, values),
        )
        expired = NewEvent(E.EXECUTION_AMBIGUOUS, rec.action_id, key, data={"error": LEASE_EXPIRED})
        head = (*head, expired)
    if step.kind == "ambiguous" and f.may_reconcile:
        return Plan(Verdict.RECONCILE_FIRST, head, writes)
    if f.mode == "observe":
        blocked = "duplicate" if step.kind == "committed" else step.kind
        started = NewEvent(E.EXECUTION_STARTED, f.action.action_id, key)
        return Plan(
            Verdict.RUN,
            (*head, started),
            writes,
            would_have=would_have or gates.would_have(f, blocked),
        )
    if step.kind == "ambiguous":
        verdict, data = Verdict.AMBIGUOUS, {"reason": "ambiguous"}
        refusal = Refusal("ambiguous", "ambiguous", action_id=step.holder, effect_key=key)
    else:
        verdict = Verdict.DUPLICATE if step.kind == "committed" else Verdict.IN_PROGRESS
        data = {"reason": "duplicate", "state": step.kind}
        refusal = Refusal("duplicate", step.kind, action_id=step.holder, effect_key=key)
    refused = NewEvent(E.EFFECT_RESERVATION_REFUSED, f.action.action_id, key, data=data)
    receipt = ReceiptSpec("blocked", f"refused: {step.kind}")
    return Plan(verdict, (*head, refused), writes, receipt, refusal)
