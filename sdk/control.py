"""The kernel: normalize -> decide -> approve -> reserve -> execute -> record.

``Control.begin`` gathers the facts of an attempt, has ``admission.plan_admission`` decide
and ``writer.admit`` write the plan in one transaction, and hands back an ``Attempt``;
``Control.finish`` records the outcome and the receipt in a second one. The SDK runs a
function between the two; the proxy forwards a request.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from . import attempt as attempts
from . import budgets, ledger
from .action import Action, Principal, new_id, parse_iso
from .approvals import DEFAULT_TTL
from .attempt import Attempt, attempt_receipt, decided, describe, not_run, record_outcome
from .context import attempt_token
from .errors import ApprovalMismatch, ApprovalTimeout, EffectKeyError, InvalidArgument
from .events import EventType
from .freeze import refuse_if_frozen
from .heartbeat import Heartbeat
from .plan import Facts, Verdict
from .receipts import Receipt
from .reconcile import ReconcileHook, Reconciler
from .templates import Template
from .writer import Admitted, admit

if TYPE_CHECKING:
    from .policy import Evaluation, Policy
    from .store import StateStore

log = logging.getLogger(__name__)
T = TypeVar("T")
Outcome = Literal["committed", "failed", "ambiguous"]
DEFAULT_LEASE = timedelta(minutes=5)


@dataclass(frozen=True)
class ReconcileFirst:
    """``begin_once`` found the key ambiguous: the remote is to be asked before deciding."""

    facts: Facts


class Control:
    """The kernel, on one policy and one ledger."""

    def __init__(
        self,
        policy: Policy,
        store: StateStore,
        *,
        clock: Callable[[], datetime] | None = None,
        approval_ttl: timedelta = DEFAULT_TTL,
        lease: timedelta = DEFAULT_LEASE,
        environment: str = "production",
    ) -> None:
        if lease <= timedelta(0) or approval_ttl <= timedelta(0):
            raise InvalidArgument("lease and approval_ttl must be positive")
        self.policy = policy
        self.store = store
        # Decisions are judged on the ledger's clock (``ctrlrun.clocks``) unless a test gives one.
        self.clock = clock or store.clock
        self.approval_ttl = approval_ttl
        self.lease = lease
        self.environment = environment
        self.reconciler = Reconciler(store, self.clock)
        self.heartbeat = Heartbeat(store, self.clock)

    @classmethod
    def from_file(cls, path: str | None = None) -> Control:
        from .config import environment, policy_path
        from .policy import Policy
        from .store import open_default_store

        resolved = policy_path(path)
        policy = Policy.from_file(resolved)  # a bad policy leaves no ledger behind
        return cls(policy, open_default_store(None, resolved), environment=environment())

    def evaluate(self, action: Action) -> Evaluation:
        return self.policy.evaluate(action.name, action.arguments)

    def action(
        self,
        name: str,
        arguments: Mapping[str, Any],
        principal: Principal,
        *,
        resource: Template | None = None,
    ) -> Action:
        """The ``Action`` for a call on this Control's policy (see ``build_action``)."""
        return build_action(
            self.policy, name, arguments, principal, self.environment, resource=resource
        )

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
        first = self.begin_once(
            action,
            effect_key,
            approval_id=approval_id,
            lease=lease,
            may_reconcile=reconcile is not None,
            idempotency_key=idempotency_key,
            upstream=upstream,
        )
        if isinstance(first, ReconcileFirst):
            assert reconcile is not None
            return self.reconcile_first(first, reconcile)
        return first

    def begin_once(
        self,
        action: Action,
        effect_key: str | None,
        *,
        approval_id: str | None = None,
        lease: timedelta | None = None,
        may_reconcile: bool = False,
        idempotency_key: str | None = None,
        upstream: str | None = None,
    ) -> Attempt | ReconcileFirst:
        """``begin`` up to the remote: it never waits on the network, so it may run in a batch
        of decisions (``decisions.decide``). A key left ambiguous that a hook may settle comes
        back as ``ReconcileFirst``, its ambiguation written: ``reconcile_first`` goes on."""
        policy, now = self.policy, self.clock()
        evaluation = policy.evaluate(action.name, action.arguments)
        asks = approval_id is None and policy.may_ask(action.name, evaluation.decision)
        facts = Facts(
            action=action,
            effect_key=effect_key,
            evaluation=evaluation,
            now=now,
            lease=lease or self.lease,
            policy_hash=policy.policy_hash,
            mode=policy.mode,
            window=policy.window(action.name),
            approval_id=approval_id,
            resend=not policy.approval_by_header_only(action.name),
            may_reconcile=may_reconcile and effect_key is not None,
            request_id=new_id("apr") if asks else None,
            approval_ttl=self.approval_ttl,
            idempotency_key=idempotency_key,
            upstream=upstream,
            started_at=now,
            budget=_budget_ask(policy, action, now),
        )
        admitted = admit(self.store, facts)
        if admitted.plan.verdict is Verdict.RECONCILE_FIRST:
            return ReconcileFirst(facts)
        return self._admitted(admitted)

    def reconcile_first(self, pending: ReconcileFirst, reconcile: ReconcileHook) -> Attempt:
        """Ask ``reconcile`` what became of the ambiguous key, then decide again."""
        facts = pending.facts
        assert facts.effect_key is not None
        self.reconciler.run(facts.effect_key, reconcile, trigger="blocking")
        again = replace(facts, now=self.clock(), may_reconcile=False, announced=True)
        admitted = admit(self.store, again)
        admitted = replace(admitted, attempt=replace(admitted.attempt, reconciled=True))
        return self._admitted(admitted)

    def _admitted(self, admitted: Admitted) -> Attempt:
        """Raise the plan's refusal (with its receipt's id), or hand back the attempt."""
        plan, name = admitted.plan, admitted.attempt.action.name
        receipt_id = None if admitted.receipt is None else admitted.receipt.receipt_id
        if plan.refusal is None:
            return admitted.attempt
        refusal = plan.refusal
        extra = decided(admitted.attempt, plan.verdict.value, refusal.reason, receipt_id)
        if plan.verdict is Verdict.DENY:
            log.info("%s denied (%s) receipt=%s", name, refusal.reason, receipt_id, extra=extra)
        elif plan.verdict is Verdict.NEEDS_APPROVAL:
            log.info("%s needs approval %s", name, refusal.request_id, extra=extra)
        else:
            log.info("%s refused: %s receipt=%s", name, plan.verdict.value, receipt_id, extra=extra)
        raise refusal.error(receipt_id)

    # -- after execution ---------------------------------------------------------------------

    def finish(self, attempt: Attempt, outcome: Outcome, *, error: str | None = None) -> Receipt:
        """Record the outcome of an attempt and write its receipt."""
        now, observe = self.clock(), self.policy.mode == "observe"
        receipt, recorded = self.store.write(
            lambda conn: record_outcome(
                conn, attempt, outcome, error, now, observe=observe, last=True
            )
        )
        action, key = attempt.action, attempt.effect_key
        extra = decided(attempt, recorded, None, receipt.receipt_id)
        log.info(
            "%s %s key=%s receipt=%s", action.name, recorded, key, receipt.receipt_id, extra=extra
        )
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
            with attempt_token(attempt.held_key), self.holding(attempt):
                value = executor()
        except BaseException as exc:
            try:
                self.settle(attempt, exc, reconcile=reconcile, reconcile_eagerly=reconcile_eagerly)
            except Exception as failure:  # the function's own exception goes on, not this
                attempts.unrecorded(attempt, exc, failure)
            raise
        return value, self.settle(attempt, None)

    def holding(self, attempt: Attempt) -> AbstractContextManager[None]:
        """Renew ``attempt``'s lease while its function runs (``heartbeat.py``)."""
        return self.heartbeat.holding(attempt, attempt.lease or self.lease)

    def settle(
        self,
        attempt: Attempt,
        error: BaseException | None,
        *,
        reconcile: ReconcileHook | None = None,
        reconcile_eagerly: bool = False,
    ) -> Receipt:
        """Record how an executed attempt ended: no error is committed, ``NotExecuted`` is
        failed, anything else ambiguous (then asked eagerly, unless it was an interrupt)."""
        if error is None:
            return self.finish(attempt, "committed")
        if not_run(error, attempt):
            return self.finish(attempt, "failed", error=describe(error))
        receipt = self.finish(attempt, "ambiguous", error=describe(error))
        if isinstance(error, Exception):
            self.eager_reconcile(attempt, reconcile, reconcile_eagerly)
        return receipt

    def release(self, attempt: Attempt, why: BaseException) -> Receipt:
        """Record an attempt whose function never started (a cancelled call) as not executed."""
        return self.finish(attempt, "failed", error=f"not started: {describe(why)}")

    def eager_reconcile(
        self, attempt: Attempt, hook: ReconcileHook | None, eagerly: bool
    ) -> str | None:
        """Ask ``hook`` right after an ambiguous outcome, unless this attempt asked already.

        Call it once per attempt: the attempt is a value, and remembers only the lazy call
        ``begin`` made.
        """
        if not eagerly or hook is None or attempt.effect_key is None or not attempt.held:
            return None
        if attempt.reconciled:
            return None
        return self.reconciler.run(attempt.effect_key, hook, trigger="eager")

    def refuse_effect_key(self, action: Action, exc: EffectKeyError) -> Receipt:
        """Record an action whose effect key cannot be resolved: denied, nothing reserved."""
        return self.record_refusal(action, "effect_key_error", str(exc))

    def record_refusal(
        self, action: Action, reason: str, error: str | None = None, *, result: str = "denied"
    ) -> Receipt:
        """Record a request refused before the policy could decide it: denied, nothing held
        (``result="observed"``: observe mode let it through)."""
        now = self.clock()
        attempt = Attempt(action, None, 0, "deny", reason, self.policy.policy_hash, now)
        with self.store.transaction() as conn:
            ledger.append_event(
                conn,
                now,
                EventType.ACTION_PROPOSED,
                action_id=action.action_id,
                data={"action_hash": action.hash},
            )
            denied = {"reason": reason} if error is None else {"reason": reason, "error": error}
            ledger.append_event(
                conn, now, EventType.ACTION_DENIED, action_id=action.action_id, data=denied
            )
            return attempt_receipt(conn, attempt, result, None, now, error=error)

    def propose_unprotected(self, action: Action, *, reason: str) -> None:
        """Record a write about to be forwarded without protection (``unmapped_writes:
        allow``), before it leaves: a ledger that cannot take this refuses the write, and
        so does the kill switch (``ActionFrozen``, recorded)."""
        now, aid = self.clock(), action.action_id
        proposed = {"action_hash": action.hash, "unprotected": True, "reason": reason}
        with self.store.transaction() as conn:
            ledger.append_event(conn, now, EventType.ACTION_PROPOSED, action_id=aid, data=proposed)
            stop = refuse_if_frozen(conn, self.store.freezes, action, now, self.policy.policy_hash)
        if stop is not None:
            raise stop

    def record_unprotected(
        self, action: Action, outcome: str, *, reason: str, error: str | None = None
    ) -> Receipt:
        """The receipt of a write forwarded without protection, once its answer is known."""
        now = self.clock()
        attempt = Attempt(action, None, 0, "allow", reason, self.policy.policy_hash, now)
        with self.store.transaction() as conn:
            return attempt_receipt(conn, attempt, outcome, None, now, error=error)

    def wait_for_approval(
        self,
        request_id: str,
        timeout: timedelta | None = None,
        *,
        stop: threading.Event | None = None,
    ) -> None:
        """Block until a human answers ``request_id`` (polling the ledger every 0.5 s).

        ``stop`` set (a cancelled caller): raise ``ApprovalTimeout`` at the next poll.
        """
        deadline = self.clock() + (timeout or self.approval_ttl)
        stop = stop or threading.Event()
        while True:
            with self.store.reading() as conn:
                row = ledger.approval_row(conn, request_id)
            if row is None:
                raise ApprovalMismatch("unknown", approval_id=request_id)
            if row["status"] != "pending":
                return
            if self.clock() >= min(deadline, parse_iso(row["expires_at"])):
                raise ApprovalTimeout(request_id)
            if stop.wait(0.5):
                raise ApprovalTimeout(request_id, f"stopped waiting for approval {request_id}")

    def resolve(self, effect_key: str, state: str, *, resolved_by: str = "cli:local") -> None:
        self.reconciler.resolve(effect_key, state, resolved_by=resolved_by)


def build_action(
    policy: Policy,
    name: str,
    arguments: Mapping[str, Any],
    principal: Principal,
    environment: str,
    *,
    resource: Template | None = None,
) -> Action:
    """The ``Action`` for a call, its resource filled from ``resource`` or else the policy's
    ``resource:`` template (so it is part of the action's hash, and an ``effect:`` template
    may name ``{resource}``). A template naming a missing argument: ``InvalidArgument``."""
    action = Action(name, arguments, principal, None, environment)
    template = resource or policy.resource_template(name)
    if template is None:
        return action
    try:
        res = template.resolve(action.arguments)
    except EffectKeyError as exc:
        raise InvalidArgument(f"{name}: resource {exc}") from exc
    return replace(action, resource=res)


def _budget_ask(policy: Policy, action: Action, now: datetime) -> budgets.BudgetAsk | None:
    budget = policy.budget(action.name)
    if budget is None:
        return None
    return budgets.ask(budget, action.name, action.principal, action.arguments, now)
