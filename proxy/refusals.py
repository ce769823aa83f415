"""Why ctrlrun refuses a protected request, as one table from exception to outcome and reason.

Every exception that stops a protected request before it is forwarded becomes a
:class:`Refusal`; its status follows from the outcome and the upstream's profile
(``answers.STATUSES``)::

    ActionFrozen          frozen                        frozen   (the kill switch)
    BudgetExceeded        budget_exceeded               budget_exceeded   (budget: spent)
    ActionDenied          denied                        .reason
      reason approval_denied  approval_invalid          (a presented approval a human denied)
    ApprovalRequired      approval_required             .request_id
    ApprovalMismatch      approval_invalid              .reason .approval_id
    ApprovalTimeout       approval_invalid              approval_timeout
    DuplicateEffect       duplicate | in_progress       .state
    AmbiguousEffect       ambiguous
    InvalidArgument       invalid_request               invalid_argument
    EffectKeyError        invalid_request               effect_key_error
    StoreError (and kin)  unavailable                   store_unavailable
    anything else         unavailable                   internal_error   (fail closed)

A ``CTRLRunError`` subclass without its own row takes its nearest ancestor's; the tests
insist every subclass has one, so a new exception is placed on purpose.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ctrlrun.errors import (
    ActionDenied,
    ActionFrozen,
    AmbiguousEffect,
    ApprovalMismatch,
    ApprovalRequired,
    ApprovalTimeout,
    BudgetExceeded,
    ConnectionLost,
    CTRLRunError,
    DuplicateEffect,
    EffectKeyError,
    InvalidArgument,
    MissingDependency,
    NotExecuted,
    OutcomeUnknown,
    PolicyError,
    SchemaMismatch,
    StoreError,
)
from ctrlrun.identity import LedgerLost
from ctrlrun.reconcile import NotAmbiguous
from ctrlrun.store import NoLedger

from .answers import Answer, answer


@dataclass(frozen=True)
class Refusal:
    """ctrlrun answers instead of the remote: the outcome, its reason, and what to say."""

    outcome: str
    reason: str
    message: str
    action: str | None = None
    effect_key: str | None = None
    receipt_id: str | None = None
    request_id: str | None = None
    resend: bool = False  # approval_required: the identical request re-sent consumes it

    def answer(self, profile: str) -> Answer:
        return answer(
            profile,
            self.outcome,
            reason=self.reason,
            message=self.message,
            action=self.action,
            effect_key=self.effect_key,
            receipt_id=self.receipt_id,
            request_id=self.request_id,
            resend=self.resend,
        )


# A row reads (outcome, reason, request_id) off the exception; ``approval`` is the approval
# the request presented (Ctrlrun-Approval), which a denial of that approval names.
Row = Callable[[Any, str | None], tuple[str, str, str | None]]


def _fixed(outcome: str, reason: str) -> Row:
    return lambda exc, approval: (outcome, reason, None)


def _denied(exc: ActionDenied, approval: str | None) -> tuple[str, str, str | None]:
    if exc.reason == "approval_denied":  # the approval presented was denied by a human
        return "approval_invalid", exc.reason, approval
    return "denied", exc.reason, None


def _duplicate(exc: DuplicateEffect, approval: str | None) -> tuple[str, str, str | None]:
    return ("duplicate" if exc.state == "committed" else "in_progress"), exc.state, None


REFUSALS: dict[type[BaseException], Row] = {
    ActionFrozen: _fixed("frozen", "frozen"),
    BudgetExceeded: _fixed("budget_exceeded", "budget_exceeded"),
    ActionDenied: _denied,
    ApprovalRequired: lambda exc, _: ("approval_required", "approval_required", exc.request_id),
    ApprovalMismatch: lambda exc, _: ("approval_invalid", exc.reason, exc.approval_id),
    ApprovalTimeout: lambda exc, _: ("approval_invalid", "approval_timeout", exc.request_id),
    DuplicateEffect: _duplicate,
    AmbiguousEffect: _fixed("ambiguous", "ambiguous"),
    InvalidArgument: _fixed("invalid_request", "invalid_argument"),
    EffectKeyError: _fixed("invalid_request", "effect_key_error"),
    StoreError: _fixed("unavailable", "store_unavailable"),
    SchemaMismatch: _fixed("unavailable", "store_unavailable"),
    NoLedger: _fixed("unavailable", "store_unavailable"),
    LedgerLost: _fixed("unavailable", "store_unavailable"),
    ConnectionLost: _fixed("unavailable", "store_unavailable"),
    OutcomeUnknown: _fixed("unavailable", "store_unavailable"),
    # Never raised on the protected path: if one is, it is a bug, and the request is refused.
    NotAmbiguous: _fixed("unavailable", "internal_error"),
    PolicyError: _fixed("unavailable", "internal_error"),
    NotExecuted: _fixed("unavailable", "internal_error"),
    MissingDependency: _fixed("unavailable", "internal_error"),
    CTRLRunError: _fixed("unavailable", "internal_error"),
    BaseException: _fixed("unavailable", "internal_error"),
}


def refusal_for(
    exc: BaseException,
    *,
    action: str | None = None,
    effect_key: str | None = None,
    approval: str | None = None,
    receipt_id: str | None = None,
) -> Refusal:
    """The refusal for ``exc``, found by walking its class's MRO through ``REFUSALS``."""
    row = next(REFUSALS[cls] for cls in type(exc).__mro__ if cls in REFUSALS)
    outcome, reason, request_id = row(exc, approval)
    if receipt_id is None and isinstance(exc, CTRLRunError):
        receipt_id = exc.receipt_id
    return Refusal(
        outcome,
        reason,
        _message(exc, reason, action),
        action=action,
        effect_key=effect_key,
        receipt_id=receipt_id,
        request_id=request_id,
        resend=isinstance(exc, ApprovalRequired) and exc.resend,
    )


def _message(exc: BaseException, reason: str, action: str | None) -> str:
    if reason == "approval_required":
        # The kernel's own message names the SDK's with_approval; over HTTP it is a header.
        return f"{action or 'this action'} needs approval {getattr(exc, 'request_id', '')}"
    if reason == "store_unavailable":
        return f"the ledger cannot be reached; nothing was sent ({exc})"
    if reason == "internal_error":
        # Only the type: the text of an unexpected exception may hold anything.
        return f"internal error ({type(exc).__name__})"
    return str(exc)
