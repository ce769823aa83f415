"""The kernel: normalize -> decide -> approve -> reserve -> execute -> record.

``Control.begin`` does everything before execution in one transaction and hands back an
``Attempt``; ``Control.finish`` records the outcome and the receipt in a second one. The SDK
runs a function between the two; the proxy forwards a request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from . import ledger
from .action import Action, iso, parse_iso, utc_now
from .approvals import DEFAULT_TTL, request_approval
from .attempt import Attempt, attempt_receipt, describe
from .context import attempt_token
from .errors import (
    ActionDenied,
    AmbiguousEffect,
    ApprovalMismatch,
    ApprovalRequired,
    ApprovalTimeout,
    EffectKeyError,
    InvalidArgument,
    NotExecuted,
)
from .events import EventType
from .receipts import Receipt
from .reconcile import ReconcileHook, Reconciler
from .reservation import Gate, LostRace, reserve
from .states import EffectState

if TYPE_CHECKING:
    from .policy import Evaluation, Policy
    from .store import StateStore

log = logging.getLogger("ctrlrun")
T = TypeVar("T")
Outcome = Literal["committed", "failed", "ambiguous"]
DEFAULT_LEASE = timedelta(minutes=5)


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
        from .config import environment, open_default_store, policy_path
        from .policy import Policy

        resolved = policy_path(path)
        policy = Policy.from_file(resolved)  # a bad policy leaves no ledger behind
        return cls(policy, open_default_store(None, resolved), environment=environment())

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
                receipt = attempt_receipt(conn, attempt, "denied", None, now)
            log.info("%s denied (%s) receipt=%s", action.name, reason, receipt.receipt_id)
            denied = ActionDenied(
                reason, f"{action.name} denied: {reason}", action_id=action.action_id
            )
            denied.receipt_id = receipt.receipt_id
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
            gate = Gate()
            try:
                with self.store.transaction() as conn:
                    ledger.append_events(conn, proposed)
                    reserve(
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
                        policy.mode == "observe",
                    )
            except LostRace:
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
                    gate.refusal.receipt_id = gate.receipt.receipt_id
                raise gate.refusal
            return attempt
        raise AmbiguousEffect(effect_key or "", "the effect record kept moving; try again later")

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
            receipt = attempt_receipt(
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
        return self.run(attempt, executor, reconcile=reconcile, reconcile_eagerly=reconcile_eagerly)

    def run(
        self,
        attempt: Attempt,
        executor: Callable[[], T],
        *,
        reconcile: ReconcileHook | None = None,
        reconcile_eagerly: bool = False,
    ) -> tuple[T, Receipt]:
        """Execute an attempt that passed ``begin`` and record what became of it."""
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
            return attempt_receipt(conn, attempt, "denied", None, now, error=str(exc))

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
            return attempt_receipt(conn, attempt, outcome, None, now, error=error)

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
