"""The values admission works on: the ``Facts`` it reads and the ``Plan`` it makes.

A plan names its verdict, the compare-and-set writes to make (``InsertEffect``,
``MoveEffect``, ``InsertApproval``, ``MoveApproval``), the events and the receipt that record
it, and the refusal to raise once they are committed. ``admission.plan_admission`` makes
plans; ``writer.admit`` applies them. A new input (a freeze switch, a budget) is a new field
of ``Facts``; a new kind of write (spending a budget) is one more class in ``Write``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from .action import Action
from .approvals import DEFAULT_TTL, Approval
from .budgets import BudgetAsk, BudgetCharge
from .errors import (
    ActionDenied,
    ActionFrozen,
    AmbiguousEffect,
    ApprovalMismatch,
    ApprovalRequired,
    BudgetExceeded,
    CTRLRunError,
    DuplicateEffect,
)
from .events import EventType
from .policy import Evaluation, Mode
from .states import EffectRecord, EffectState


@dataclass(frozen=True)
class Facts:
    """Everything admission depends on, as values read before planning."""

    action: Action
    effect_key: str | None
    evaluation: Evaluation
    now: datetime
    lease: timedelta
    policy_hash: str
    mode: Mode = "enforce"
    window: timedelta | None = None
    record: EffectRecord | None = None  # the key's record; None: no record (or not read yet)
    approval_id: str | None = None  # the approval presented
    approval: Mapping[str, Any] | None = None  # its row; None: no such approval
    # With no approval presented, the writer may look up a granted one for this very action
    # hash (the hash covers the principal) and present it: "the identical request, re-sent".
    resend: bool = False
    may_reconcile: bool = False  # a hook is given and has not been asked for this attempt
    announced: bool = False  # ACTION_PROPOSED and POLICY_EVALUATED are written already
    request_id: str | None = None  # the id a new approval request gets
    # A pending request for this very action (the identical request re-sent): asked again.
    pending_request: str | None = None
    approval_ttl: timedelta = DEFAULT_TTL
    idempotency_key: str | None = None  # stored with the attempt (what the proxy forwarded)
    upstream: str | None = None
    started_at: datetime | None = None  # when the call began (None: now)
    frozen: str | None = None  # why the action is frozen (the kill switch), None: it is not
    budget: BudgetAsk | None = None  # the budget row it spends (budgets.py), read in the txn
    holder: str | None = None  # the process writing the plan, as a lease holder (holder.py)
    # This host's monotonic clock when the facts were read (None: judge by ``now`` alone).
    steady_now: float | None = None


class Verdict(StrEnum):
    """What admission decided (see the module docstring)."""

    FROZEN = "frozen"
    BUDGET_EXCEEDED = "budget_exceeded"
    DENY = "deny"
    NEEDS_APPROVAL = "needs_approval"
    APPROVAL_INVALID = "approval_invalid"
    DUPLICATE = "duplicate"
    IN_PROGRESS = "in_progress"
    AMBIGUOUS = "ambiguous"
    RECONCILE_FIRST = "reconcile_first"
    RESERVE = "reserve"
    RUN = "run"


@dataclass(frozen=True)
class NewEvent:
    """One event to append (its time is the plan's ``now``)."""

    type: EventType
    action_id: str | None
    effect_key: str | None = None
    approval_id: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class InsertEffect:
    """NEW -> EXECUTING: insert the record unless the key exists (then read it, plan again)."""

    values: Mapping[str, Any]


@dataclass(frozen=True)
class MoveEffect:
    """A compare-and-set transition of the record as it was read."""

    effect_key: str
    old: EffectState
    new: EffectState
    action_id: str
    attempt: int
    values: Mapping[str, Any]


@dataclass(frozen=True)
class InsertApproval:
    """A new pending approval request."""

    values: Mapping[str, Any]


@dataclass(frozen=True)
class MoveApproval:
    """A compare-and-set change of an approval's status (granted -> consumed or expired)."""

    approval_id: str
    old: str
    new: str
    values: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ConsumeBudget:
    """A compare-and-set of a budget row's ``spent``, from what was read to ``spent + amount``."""

    ask: BudgetAsk
    charge: BudgetCharge


Write = InsertEffect | MoveEffect | InsertApproval | MoveApproval | ConsumeBudget
RefusalKind = Literal[
    "frozen", "budget", "denied", "approval_required", "approval_invalid", "duplicate", "ambiguous"
]


@dataclass(frozen=True)
class Refusal:
    """The error a plan raises once its transaction has committed."""

    kind: RefusalKind
    reason: str  # ActionDenied/ApprovalMismatch reason, or the DuplicateEffect state
    message: str | None = None
    action_id: str | None = None  # the refused action's, or the key holder's
    effect_key: str | None = None
    request_id: str | None = None  # the approval requested, or the one presented
    resend: bool = False  # approval_required: re-sending the identical action will consume it

    def error(self, receipt_id: str | None = None) -> CTRLRunError:
        r, m, kw = self.reason, self.message, {"receipt_id": receipt_id}
        if self.kind == "frozen":
            return ActionFrozen(m or r, action_id=self.action_id, **kw)
        if self.kind == "budget":
            return BudgetExceeded(m or r, action_id=self.action_id, **kw)
        if self.kind == "denied":
            return ActionDenied(r, m, action_id=self.action_id, **kw)
        if self.kind == "approval_required":
            return ApprovalRequired(
                self.request_id or "", m, action_id=self.action_id, resend=self.resend, **kw
            )
        if self.kind == "approval_invalid":
            return ApprovalMismatch(r, m, approval_id=self.request_id, **kw)
        if self.kind == "duplicate":
            key = self.effect_key
            return DuplicateEffect(m, state=r, effect_key=key, action_id=self.action_id, **kw)
        return AmbiguousEffect(self.effect_key or "", m, action_id=self.action_id, **kw)


@dataclass(frozen=True)
class ReceiptSpec:
    """The receipt a refusal writes."""

    result: Literal["denied", "blocked"]
    error: str | None = None
    approval_id: str | None = None


@dataclass(frozen=True)
class Plan:
    """What to write for one admission, and what the attempt then holds."""

    verdict: Verdict
    events: tuple[NewEvent, ...] = ()
    writes: tuple[Write, ...] = ()
    receipt: ReceiptSpec | None = None
    refusal: Refusal | None = None
    attempt: int = 0  # the attempt number the key is held under (RESERVE)
    approval: Approval | None = None  # consumed by this plan
    would_have: Mapping[str, str] | None = None  # observe mode: what enforcement would do

    @property
    def held(self) -> bool:
        return self.verdict is Verdict.RESERVE
