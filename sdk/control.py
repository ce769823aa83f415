"""The kernel: normalize -> decide -> approve -> reserve -> execute -> record.

``Control.begin`` does everything before execution in one transaction and hands back an
``Attempt``; ``Control.finish`` records the outcome and the receipt in a second one. The SDK
runs a function between the two; the proxy forwards a request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from sqlalchemy import Connection

from . import ledger
from .action import Action, iso, parse_iso, utc_now
from .approvals import DEFAULT_TTL, Approval, consume, request_approval
from .context import attempt_token, idempotency_token_for
from .errors import (
    ActionDenied,
    AmbiguousEffect,
    ApprovalMismatch,
    ApprovalRequired,
    ApprovalTimeout,
    CTRLRunError,
    DuplicateEffect,
    EffectKeyError,
    InvalidArgument,
    NotExecuted,
)
from .events import EventType
from .receipts import Receipt, write_receipt
from .reconcile import ReconcileHook, Reconciler
from .states import EffectState, Refuse, Reserve, plan_reservation

if TYPE_CHECKING:
    from .policy import Evaluation, Policy
    from .store import StateStore

log = logging.getLogger("ctrlrun")
T = TypeVar("T")
Outcome = Literal["committed", "failed", "ambiguous"]
DEFAULT_LEASE = timedelta(minutes=5)


@dataclass
class Attempt:
    """One attempt that passed the gates and may execute."""

    action: Action
    effect_key: str | None
    attempt: int
    decision: str
    reason: str
    policy_hash: str
    started_at: datetime
    approval: Approval | None = None
    held: bool = False  # this attempt holds the effect key
    would_have: dict[str, Any] | None = None  # observe mode: what enforcement would have done
    reconciled: bool = False  # the one reconcile call of this attempt has been made

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


class _LostRace(Exception):
    """The reservation's conditional write found the key taken: roll back and plan again."""


@dataclass
class _Gate:
    """What the reservation transaction decided, applied after it commits."""

    refusal: CTRLRunError | None = None
    reconcile: bool = False
    receipt: Receipt | None = None


class Control:
    """The kernel, on one policy and one ledger."""

    def __init__(
        self,
        policy: Policy,
        store: StateStore,
        *,
        clock: Callable[[], datetime] = utc_now,
        approval_ttl: timedelta = DEFAULT_TTL,
        lease: timedelta = DEFAULT_LEASE,
        environment: str = "production",
    ) -> None:
        if lease <= timedelta(0) or approval_ttl <= timedelta(0):
            raise InvalidArgument("lease and approval_ttl must be positive")
        self.policy = policy
        self.store = store
        self.clock = clock
        self.approval_ttl = approval_ttl
        self.lease = lease
        self.environment = environment
        self.reconciler = Reconciler(store, clock)

    @classmethod
    def from_file(cls, path: str | None = None) -> Control:
        from .config import default_control

        return default_control(path)

    def evaluate(self, action: Action) -> Evaluation:
        return self.policy.evaluate(action.name, action.arguments)

    # -- before execution --------------------------------------------------------------------

    def begin(
        self,
        action: Action,
        effect_key: str | None,
        *,
        approval_id: str | None = None,
        lease: timedelta | None = None,
        reconcile: ReconcileHook | None = None,
        idempotency_key: str | None = None,
        upstream: str | None = None,
    ) -> Attempt:
        """Decide, check the approval and reserve the effect key; raise the refusal if any."""
        policy = self.policy
        now = self.clock()
        evaluation = policy.evaluate(action.name, action.arguments)
        decision, reason = evaluation.decision.value, evaluation.reason
        observe = policy.mode == "observe"
        attempt = Attempt(action, effect_key, 0, decision, reason, policy.policy_hash, now)
        proposed = [
            ledger.event_row(
                now,
                EventType.ACTION_PROPOSED,
                action.action_id,
                effect_key,
                data={"action_hash": action.hash},
            ),
            ledger.event_row(
                now,
                EventType.POLICY_EVALUATED,
                action.action_id,
                effect_key,
                data={"decision": decision, "reason": reason},
            ),
        ]
        if observe and decision != "allow":
            blocked = "approval_required" if decision == "approve" else reason
            attempt.would_have = {"decision": decision, "reason": reason, "blocked_reason": blocked}
        elif decision == "deny":
            with self.store.transaction() as conn:
                ledger.append_events(conn, proposed)
                ledger.append_event(
                    conn,
                    now,
                    EventType.ACTION_DENIED,
                    action_id=action.action_id,
                    effect_key=effect_key,
                    data={"reason": reason},
                )
                receipt = self._receipt(conn, attempt, "denied", None, now)
            log.info("%s denied (%s) receipt=%s", action.name, reason, receipt.receipt_id)
            denied = ActionDenied(
                reason, f"{action.name} denied: {reason}", action_id=action.action_id
            )
            denied.receipt_id = receipt.receipt_id  # type: ignore[attr-defined]
            raise denied
        elif decision == "approve" and approval_id is None:
            with self.store.transaction() as conn:
                ledger.append_events(conn, proposed)
                request_id = request_approval(
                    conn, action, now, self.approval_ttl, policy.policy_hash
                )
            log.info("%s needs approval %s", action.name, request_id)
            raise ApprovalRequired(request_id, action_id=action.action_id)

        lease_for = lease or self.lease
        window = policy.window(action.name)
        for _ in range(3):  # a lazy reconcile or a lost insert race re-plans; bounded
            gate = _Gate()
            try:
                with self.store.transaction() as conn:
                    ledger.append_events(conn, proposed)
                    self._reserve(
                        conn,
                        attempt,
                        gate,
                        now,
                        lease_for,
                        window,
                        reconcile,
                        approval_id if decision == "approve" and not observe else None,
                        idempotency_key,
                        upstream,
                    )
            except _LostRace:
                # Another sidecar took the key between our read and our write. Everything this
                # transaction wrote (an approval consumed, events) is rolled back: plan again.
                continue
            proposed = []
            if gate.reconcile and reconcile is not None and effect_key is not None:
                attempt.reconciled = True
                self.reconciler.run(effect_key, reconcile, trigger="blocking")
                now = self.clock()
                continue
            if gate.refusal is not None:
                log.info("%s refused: %s", action.name, gate.refusal)
                if gate.receipt is not None:
                    gate.refusal.receipt_id = gate.receipt.receipt_id  # type: ignore[attr-defined]
                raise gate.refusal
            return attempt
        raise AmbiguousEffect(effect_key or "", "the effect record kept moving; try again later")

    def _reserve(
        self,
        conn: Connection,
        attempt: Attempt,
        gate: _Gate,
        now: datetime,
        lease: timedelta,
        window: timedelta | None,
        reconcile: ReconcileHook | None,
        approval_id: str | None,
        idempotency_key: str | None,
        upstream: str | None,
    ) -> None:
        action, key = attempt.action, attempt.effect_key
        observe = attempt.would_have is not None or self.policy.mode == "observe"
        # Most keys are new: try the insert first and read the record only if it exists.
        if (
            key is not None
            and approval_id is None
            and not observe
            and self._insert_new(conn, attempt, key, now, lease, idempotency_key, upstream)
        ):
            return
        if key is not None:
            record = ledger.get_effect(conn, key)
            plan = plan_reservation(record, now, window)
            if isinstance(plan, Refuse):
                assert record is not None
                if plan.ambiguate:
                    ledger.move_effect(
                        conn,
                        key,
                        old=record.state,
                        new=EffectState.AMBIGUOUS,
                        action_id=record.action_id,
                        attempt=record.attempt,
                        values={
                            "updated_at": iso(now),
                            "lease_expires_at": None,
                            "error": "lease expired before an outcome was recorded",
                        },
                    )
                    ledger.append_event(
                        conn,
                        now,
                        EventType.EXECUTION_AMBIGUOUS,
                        action_id=record.action_id,
                        effect_key=key,
                        data={"error": "lease expired before an outcome was recorded"},
                    )
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
                gate.receipt = self._receipt(
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
                gate.receipt = self._receipt(
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
            values = _effect_values(action, plan.attempt, now, lease, idempotency_key, upstream)
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
                raise _LostRace
            self._held(conn, attempt, key, plan.attempt, now, lease)
        else:
            ledger.append_event(conn, now, EventType.EXECUTION_STARTED, action_id=action.action_id)

    def _insert_new(
        self,
        conn: Connection,
        attempt: Attempt,
        key: str,
        now: datetime,
        lease: timedelta,
        idempotency_key: str | None,
        upstream: str | None,
    ) -> bool:
        values = _effect_values(attempt.action, 1, now, lease, idempotency_key, upstream)
        values.update(effect_key=key, state=EffectState.EXECUTING.value, created_at=iso(now))
        if not ledger.insert_effect(conn, values):
            return False
        self._held(conn, attempt, key, 1, now, lease)
        return True

    @staticmethod
    def _held(
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

    # -- after execution ---------------------------------------------------------------------

    def finish(self, attempt: Attempt, outcome: Outcome, *, error: str | None = None) -> Receipt:
        """Record the outcome of an attempt and write its receipt."""
        now = self.clock()
        action, key = attempt.action, attempt.effect_key
        event = {
            "committed": EventType.EXECUTION_COMMITTED,
            "failed": EventType.EXECUTION_FAILED,
            "ambiguous": EventType.EXECUTION_AMBIGUOUS,
        }[outcome]
        with self.store.transaction() as conn:
            if attempt.held and key is not None:
                values: dict[str, Any] = {
                    "updated_at": iso(now),
                    "lease_expires_at": None,
                    "error": error,
                }
                if outcome == "committed":
                    values["committed_at"] = iso(now)
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
                    # Our lease ran out and a contender ambiguated the record: the outcome we
                    # saw cannot be written over it, so this attempt is recorded as ambiguous.
                    error = f"outcome {outcome} not recorded: the record moved while executing"
                    outcome, event = "ambiguous", EventType.EXECUTION_AMBIGUOUS
            data = {"error": error} if outcome != "committed" else {}
            pos = ledger.append_event(
                conn, now, event, action_id=action.action_id, effect_key=key, data=data
            )
            observed = attempt.would_have is not None or self.policy.mode == "observe"
            receipt = self._receipt(
                conn,
                attempt,
                "observed" if observed else outcome,
                outcome,
                now,
                error=error,
                event_pos=pos,
            )
        log.info("%s %s key=%s receipt=%s", action.name, outcome, key, receipt.receipt_id)
        return receipt

    def execute(
        self,
        action: Action,
        executor: Callable[[], T],
        effect_key: str | None = None,
        *,
        approval_id: str | None = None,
        lease: timedelta | None = None,
        reconcile: ReconcileHook | None = None,
        reconcile_eagerly: bool = False,
    ) -> tuple[T, Receipt]:
        """Run ``executor`` under the full pipeline; returns its value and the receipt."""
        attempt = self.begin(
            action, effect_key, approval_id=approval_id, lease=lease, reconcile=reconcile
        )
        try:
            with attempt_token(attempt.held_key):
                value = executor()
        except NotExecuted as exc:
            self.finish(attempt, "failed", error=describe(exc))
            raise
        except BaseException as exc:
            self.finish(attempt, "ambiguous", error=describe(exc))
            if isinstance(exc, Exception):
                self.eager_reconcile(attempt, reconcile, reconcile_eagerly)
            raise
        return value, self.finish(attempt, "committed")

    def eager_reconcile(
        self, attempt: Attempt, hook: ReconcileHook | None, eagerly: bool
    ) -> str | None:
        if not eagerly or hook is None or attempt.effect_key is None or not attempt.held:
            return None
        if attempt.reconciled:
            return None
        attempt.reconciled = True
        return self.reconciler.run(attempt.effect_key, hook, trigger="eager")

    def refuse_effect_key(self, action: Action, exc: EffectKeyError) -> Receipt:
        """Record an action whose effect key cannot be resolved: denied, nothing reserved."""
        now = self.clock()
        attempt = Attempt(action, None, 0, "deny", "effect_key_error", self.policy.policy_hash, now)
        with self.store.transaction() as conn:
            ledger.append_event(
                conn,
                now,
                EventType.ACTION_PROPOSED,
                action_id=action.action_id,
                data={"action_hash": action.hash},
            )
            ledger.append_event(
                conn,
                now,
                EventType.ACTION_DENIED,
                action_id=action.action_id,
                data={"reason": "effect_key_error", "error": str(exc)},
            )
            return self._receipt(conn, attempt, "denied", None, now, error=str(exc))

    def record_unprotected(
        self, action: Action, outcome: str, *, reason: str, error: str | None = None
    ) -> Receipt:
        """A receipt for a write forwarded without protection (``unmapped_writes: allow``)."""
        now = self.clock()
        attempt = Attempt(action, None, 0, "allow", reason, self.policy.policy_hash, now)
        with self.store.transaction() as conn:
            ledger.append_event(
                conn,
                now,
                EventType.ACTION_PROPOSED,
                action_id=action.action_id,
                data={"action_hash": action.hash, "unprotected": True},
            )
            return self._receipt(conn, attempt, outcome, None, now, error=error)

    def wait_for_approval(self, request_id: str, timeout: timedelta | None = None) -> None:
        """Block until a human answers ``request_id`` (polling the ledger every 0.5 s)."""
        deadline = self.clock() + (timeout or self.approval_ttl)
        while True:
            with self.store.reading() as conn:
                row = ledger.approval_row(conn, request_id)
            if row is None:
                raise ApprovalMismatch("unknown", approval_id=request_id)
            if row["status"] != "pending":
                return
            if self.clock() >= min(deadline, parse_iso(row["expires_at"])):
                raise ApprovalTimeout(request_id)
            time.sleep(0.5)

    def resolve(self, effect_key: str, state: str, *, resolved_by: str = "cli:local") -> None:
        self.reconciler.resolve(effect_key, state, resolved_by=resolved_by)

    def _receipt(
        self,
        conn: Connection,
        attempt: Attempt,
        result: str,
        execution: str | None,
        now: datetime,
        *,
        error: str | None = None,
        approval_id: str | None = None,
        event_pos: int | None = None,
    ) -> Receipt:
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
            "started_at": iso(attempt.started_at),
            "finished_at": iso(now),
        }
        if result == "observed":
            fields["execution"] = execution
            fields["would_have"] = attempt.would_have
        return write_receipt(conn, fields, event_pos=event_pos)


def _effect_values(
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


def describe(exc: BaseException) -> str:
    """``Type: message`` on one line, for records and logs."""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
