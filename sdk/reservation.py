"""The reservation transaction: plan the effect key, check the approval, write the record.

Pure planning lives in ``states.plan_reservation``; this module applies a plan on an open
connection. It runs inside ``Control.begin``'s transaction; the caller owns the commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from . import ledger
from .action import Action, iso
from .approvals import consume
from .attempt import Attempt, attempt_receipt
from .errors import (
    ActionDenied,
    AmbiguousEffect,
    ApprovalMismatch,
    CTRLRunError,
    DuplicateEffect,
)
from .events import EventType
from .receipts import Receipt
from .reconcile import ReconcileHook
from .states import EffectState, Refuse, Reserve, plan_reservation


class LostRace(Exception):
    """The reservation's conditional write found the key taken: roll back and plan again."""


@dataclass
class Gate:
    """What the reservation transaction decided, applied after it commits."""

    refusal: CTRLRunError | None = None
    reconcile: bool = False
    receipt: Receipt | None = None


def reserve(
    conn: Connection,
    attempt: Attempt,
    gate: Gate,
    now: datetime,
    lease: timedelta,
    window: timedelta | None,
    reconcile: ReconcileHook | None,
    approval_id: str | None,
    idempotency_key: str | None,
    upstream: str | None,
    observe_mode: bool,
) -> None:
    """Plan and write the reservation of ``attempt``'s effect key, consuming its approval.

    Refusals are recorded (events and a receipt) and left in ``gate`` for the caller to raise
    once this transaction has committed; a lost insert race raises ``LostRace`` to roll back.
    """
    action, key = attempt.action, attempt.effect_key
    observe = attempt.would_have is not None or observe_mode
    # Most keys are new: try the insert first and read the record only if it exists.
    if (
        key is not None
        and approval_id is None
        and not observe
        and insert_new(conn, attempt, key, now, lease, idempotency_key, upstream)
    ):
        return
    if key is not None:
        record = ledger.get_effect(conn, key)
        plan = plan_reservation(record, now, window)
        if isinstance(plan, Refuse):
            assert record is not None
            if plan.ambiguate and not ledger.expire_lease(conn, record, now):
                raise LostRace  # the record moved while we planned: plan again
            if plan.kind == "ambiguous" and reconcile is not None and not attempt.reconciled:
                gate.reconcile = True
                return
            if observe:
                attempt.would_have = attempt.would_have or {
                    "decision": attempt.decision,
                    "reason": attempt.reason,
                    "blocked_reason": "duplicate" if plan.kind == "committed" else plan.kind,
                }
                ledger.append_event(
                    conn,
                    now,
                    EventType.EXECUTION_STARTED,
                    action_id=action.action_id,
                    effect_key=key,
                )
                return
            data: dict[str, Any] = {"reason": "ambiguous"}
            if plan.kind != "ambiguous":
                data = {"reason": "duplicate", "state": plan.kind}
            ledger.append_event(
                conn,
                now,
                EventType.EFFECT_RESERVATION_REFUSED,
                action_id=action.action_id,
                effect_key=key,
                data=data,
            )
            gate.receipt = attempt_receipt(
                conn, attempt, "blocked", None, now, error=f"refused: {plan.kind}"
            )
            if plan.kind == "ambiguous":
                gate.refusal = AmbiguousEffect(key, action_id=plan.holder)
            else:
                gate.refusal = DuplicateEffect(plan.kind, key, action_id=plan.holder)
            return
    if approval_id is not None:
        try:
            attempt.approval = consume(conn, approval_id, action, now)
        except (ApprovalMismatch, ActionDenied) as exc:
            reason = getattr(exc, "reason", "mismatch")
            ledger.append_event(
                conn,
                now,
                EventType.APPROVAL_INVALIDATED,
                action_id=action.action_id,
                approval_id=approval_id,
                effect_key=key,
                data={"reason": reason, "action_hash": action.hash},
            )
            result = "denied" if isinstance(exc, ActionDenied) else "blocked"
            gate.receipt = attempt_receipt(
                conn, attempt, result, None, now, error=str(exc), approval_id=approval_id
            )
            gate.refusal = exc
            return
        ledger.append_event(
            conn,
            now,
            EventType.APPROVAL_CONSUMED,
            action_id=action.action_id,
            approval_id=approval_id,
            data={"approver": attempt.approval.approver},
        )
    if key is not None:
        assert isinstance(plan, Reserve)
        values = effect_values(action, plan.attempt, now, lease, idempotency_key, upstream)
        # Reserved and executing in one transaction: nobody can see the key in between.
        if plan.previous is EffectState.NEW:
            won = ledger.insert_effect(
                conn,
                {
                    **values,
                    "effect_key": key,
                    "state": EffectState.EXECUTING.value,
                    "created_at": iso(now),
                },
            )
        else:
            assert record is not None
            won = ledger.move_effect(
                conn,
                key,
                old=record.state,
                new=EffectState.RESERVED,
                action_id=record.action_id,
                attempt=record.attempt,
                values={**values, "committed_at": None},
            )
            if won:
                ledger.move_effect(
                    conn,
                    key,
                    old=EffectState.RESERVED,
                    new=EffectState.EXECUTING,
                    action_id=action.action_id,
                    attempt=plan.attempt,
                    values={},
                )
        if not won:
            raise LostRace
        held(conn, attempt, key, plan.attempt, now, lease)
    else:
        ledger.append_event(conn, now, EventType.EXECUTION_STARTED, action_id=action.action_id)


def insert_new(
    conn: Connection,
    attempt: Attempt,
    key: str,
    now: datetime,
    lease: timedelta,
    idempotency_key: str | None,
    upstream: str | None,
) -> bool:
    """Try the common case in one statement: a key nobody has reserved yet."""
    values = effect_values(attempt.action, 1, now, lease, idempotency_key, upstream)
    values.update(effect_key=key, state=EffectState.EXECUTING.value, created_at=iso(now))
    if not ledger.insert_effect(conn, values):
        return False
    held(conn, attempt, key, 1, now, lease)
    return True


def held(
    conn: Connection, attempt: Attempt, key: str, number: int, now: datetime, lease: timedelta
) -> None:
    attempt.attempt, attempt.held = number, True
    action_id = attempt.action.action_id
    ledger.append_events(
        conn,
        [
            ledger.event_row(
                now,
                EventType.EFFECT_RESERVED,
                action_id,
                key,
                data={"attempt": number, "lease_expires_at": iso(now + lease)},
            ),
            ledger.event_row(now, EventType.EXECUTION_STARTED, action_id, key),
        ],
    )


def effect_values(
    action: Action,
    number: int,
    now: datetime,
    lease: timedelta,
    idempotency_key: str | None,
    upstream: str | None,
) -> dict[str, Any]:
    return {
        "action_id": action.action_id,
        "attempt": number,
        "lease_expires_at": iso(now + lease),
        "action_name": action.name,
        "action_json": action.canonical.decode("utf-8"),
        "idempotency_key": idempotency_key,
        "upstream": upstream,
        "updated_at": iso(now),
        "attempt_started_at": iso(now),
        "result_json": None,
        "error": None,
        "resolved_by": None,
        "committed_at": None,
    }
