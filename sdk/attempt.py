"""One attempt at an action: what passed the gates, and the receipt that records it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from . import budgets, holder, ledger, pg_hot, steady, tracing
from .action import Action
from .approvals import Approval
from .budgets import BudgetCharge
from .context import idempotency_token_for
from .errors import NotExecuted
from .events import EventType
from .receipts import Receipt, write_receipt
from .redact import redact
from .states import EffectState
from .timestamps import stamp

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Attempt:
    """One attempt at an action, as admission left it: what it holds and how it was decided."""

    action: Action
    effect_key: str | None
    attempt: int
    decision: str
    reason: str
    policy_hash: str
    started_at: datetime
    approval: Approval | None = None
    held: bool = False  # this attempt holds the effect key
    would_have: Mapping[str, str] | None = None  # observe mode: what enforcement would have done
    reconciled: bool = False  # the one reconcile call of this attempt has been made
    lease: timedelta | None = None  # the lease it holds its key under (renewed while it runs)
    budget: BudgetCharge | None = None  # what it spent of its budget (given back if it fails)

    @property
    def held_key(self) -> tuple[str, int] | None:
        """(effect key, attempt) while this attempt holds its key."""
        if self.effect_key is None or not self.held:
            return None
        return self.effect_key, self.attempt

    @property
    def token(self) -> str | None:
        held = self.held_key
        return None if held is None else idempotency_token_for(*held)


_OUTCOME_EVENTS = {
    "committed": EventType.EXECUTION_COMMITTED,
    "failed": EventType.EXECUTION_FAILED,
    "ambiguous": EventType.EXECUTION_AMBIGUOUS,
}


def attempt_receipt(
    conn: Connection,
    attempt: Attempt,
    result: str,
    execution: str | None,
    now: datetime,
    *,
    error: str | None = None,
    approval_id: str | None = None,
    event_pos: int | None = None,
    chain: tuple[int, str] | None = None,
    commit: bool = False,
) -> Receipt:
    """Write the receipt of ``attempt`` (in the caller's transaction; ``commit``: its last
    write, ``ledger.store_receipt``)."""
    action = attempt.action
    fields: dict[str, Any] = {
        "action_id": action.action_id,
        "action": action.name,
        "action_hash": action.hash,
        "arguments": action.arguments,
        "principal": action.principal.to_dict(),
        "resource": action.resource,
        "environment": action.environment,
        "decision": attempt.decision,
        "decision_reason": attempt.reason,
        "approval_id": attempt.approval.approval_id if attempt.approval else approval_id,
        "approver": attempt.approval.approver if attempt.approval else None,
        "effect_key": attempt.effect_key,
        "attempt": attempt.attempt or None,
        "result": result,
        "error": error,
        "policy_hash": attempt.policy_hash,
        "started_at": stamp(attempt.started_at),
        "finished_at": stamp(now),
    }
    trace_id = tracing.trace_id()
    if trace_id is not None:  # optional: only a traced request or call has one
        fields["trace_id"] = trace_id
    if result == "observed":
        fields["execution"] = execution
        fields["would_have"] = None if attempt.would_have is None else dict(attempt.would_have)
    return write_receipt(conn, fields, event_pos=event_pos, chain=chain, commit=commit)


def decided(
    attempt: Attempt, outcome: str, reason: str | None, receipt_id: str | None
) -> dict[str, Any]:
    """The decision's fields, for its log line's ``extra`` (and the current span)."""
    return tracing.decision(
        action=attempt.action.name,
        effect_key=attempt.effect_key,
        outcome=outcome,
        reason=reason,
        receipt_id=receipt_id,
        policy_hash=attempt.policy_hash,
        agent=attempt.action.principal.agent,
    )


def describe(exc: BaseException) -> str:
    """``Type: message`` on one line, credentials masked, for records and logs."""
    message = redact(" ".join(str(exc).split()))
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def unrecorded(attempt: Attempt, error: BaseException, failure: Exception) -> None:
    """The function of ``attempt`` raised ``error`` and the ledger then failed to record it
    (a full or read-only disk, a database gone). Said in one ERROR line and a note on
    ``error``, which the caller re-raises: the ledger's failure in its place turned a Ctrl-C
    or ``sys.exit`` into an ``Exception`` that a retry loop swallowed, and hid a
    ``NotExecuted``. The record stays executing under its lease, ambiguous once it ends."""
    key = attempt.effect_key or attempt.action.name
    said = f"the outcome of {key} ({describe(error)}) could not be recorded: {describe(failure)}"
    log.error("%s; its record stays executing until its lease runs out", said)
    error.add_note(f"ctrlrun: {said}")


def not_run(error: BaseException, attempt: Attempt) -> bool:
    """Whether ``error`` proves that ``attempt``'s function did nothing: a ``NotExecuted``,
    unless a protected call made inside that function raised it (and was recorded failed
    for it): the function may have acted before that call, so for it this proves nothing."""
    if not isinstance(error, NotExecuted):
        return False
    holder = getattr(error, "_ctrlrun_recorded_for", None)
    if holder is None:
        error._ctrlrun_recorded_for = attempt.action.action_id  # type: ignore[attr-defined]
        return True
    return bool(holder == attempt.action.action_id)


def record_outcome(
    conn: Connection,
    attempt: Attempt,
    outcome: str,
    error: str | None,
    now: datetime,
    *,
    observe: bool,
    last: bool = False,
) -> tuple[Receipt, str]:
    """Move the attempt's record to its outcome, with its event and receipt (in the caller's
    transaction); returns the receipt and the outcome recorded. Runs again whole on a retried
    transaction, so it changes nothing but the ledger. ``last``: the caller writes nothing
    after it (on PostgreSQL the usual case then sends its COMMIT with the receipt)."""
    action, key = attempt.action, attempt.effect_key
    observed = attempt.would_have is not None or observe
    if attempt.held and key is not None:
        values: dict[str, Any] = {
            "updated_at": stamp(now),
            "lease_expires_at": None,
            "lease_steady_until": None,
        }
        values["error"] = error
        if outcome == "committed":
            values.update(committed(now))
        if conn.dialect.name == "postgresql" and (outcome != "failed" or attempt.budget is None):
            done = _in_one_trip(conn, attempt, outcome, error, now, values, observed, last)
            if done is not None:  # the usual case
                return done, outcome
        moved = ledger.move_effect(
            conn,
            key,
            old=EffectState.EXECUTING,
            new=EffectState(outcome),
            action_id=action.action_id,
            attempt=attempt.attempt,
            values=values,
        )
        if not moved:
            # Our lease ran out and a contender ambiguated the record: the outcome we saw
            # cannot be written over it, so this attempt is recorded as ambiguous.
            error = f"outcome {outcome} not recorded: the record moved while executing"
            outcome = "ambiguous"
    if outcome == "failed" and attempt.budget is not None:
        budgets.refund(conn, attempt.budget)  # it did not happen: give its amount back
    data = {"error": error} if outcome != "committed" else None
    event = _OUTCOME_EVENTS[outcome]
    pos = ledger.append_event(
        conn, now, event, action_id=action.action_id, effect_key=key, data=data
    )
    result = "observed" if observed else outcome
    receipt = attempt_receipt(conn, attempt, result, outcome, now, error=error, event_pos=pos)
    return receipt, outcome


def committed(now: datetime) -> dict[str, Any]:
    """A commit's stamps: on the ledger's clock, and on this host's monotonic clock with its
    name (what ``states.window_over`` measures a window from)."""
    return {
        "committed_at": stamp(now),
        "committed_steady": steady.monotonic(),
        "committed_on": holder.clock(),
    }


def _in_one_trip(
    conn: Connection,
    attempt: Attempt,
    outcome: str,
    error: str | None,
    now: datetime,
    values: dict[str, Any],
    observed: bool,
    last: bool,
) -> Receipt | None:
    """PostgreSQL: the move, its event and the chain's next number in one statement, then
    the receipt and the head in another (with the COMMIT when ``last``); None when the
    record had moved (nothing written)."""
    action, key = attempt.action, attempt.effect_key
    assert key is not None
    data = {"error": error} if outcome != "committed" else None
    row = ledger.event_row(now, _OUTCOME_EVENTS[outcome], action.action_id, key, None, data)
    move = (EffectState.EXECUTING, EffectState(outcome), action.action_id, attempt.attempt)
    done = pg_hot.move_with_event(conn, key, move, values, row)
    if done is None:
        return None
    seq, prev, pos = done
    result = "observed" if observed else outcome
    chain = (seq, prev)
    return attempt_receipt(
        conn, attempt, result, outcome, now, error=error, event_pos=pos, chain=chain, commit=last
    )
