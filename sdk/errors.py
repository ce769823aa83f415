"""The exceptions ctrlrun raises.

Every one of them derives from :class:`CTRLRunError`::

    CTRLRunError
     +-- InvalidArgument      a value ctrlrun cannot accept (a float, an empty name, a bad template)
     +-- PolicyError          a policy that cannot be loaded or validated
     +-- EffectKeyError       an effect template that cannot be resolved for this call
     +-- ActionDenied         the policy (or a missing principal) says no     .reason
     +-- ApprovalRequired     a human must approve first                      .request_id
     +-- ApprovalMismatch     the approval presented does not fit this action .reason
     +-- ApprovalTimeout      nobody answered an approval in time             .request_id
     +-- DuplicateEffect      the effect is committed or in progress          .state .effect_key
     +-- AmbiguousEffect      nobody knows whether the effect happened        .effect_key
     +-- NotExecuted          raised by an executor: the remote certainly did nothing
     +-- StoreError           the ledger could not be read or written
     |    +-- SchemaMismatch  the ledger's schema is newer than (or foreign to) this code
     |    +-- LedgerLost      not the ledger created here, or lost while in use (identity.py)
     +-- MissingDependency    an optional extra is not installed              .module .extra

Every constructor takes ``receipt_id=`` (keyword only): the receipt that records the refusal,
when one was written. ``DuplicateEffect`` takes its arguments as the reference library does:
``DuplicateEffect(message=None, *, state, effect_key=None)``.
"""

from __future__ import annotations


class CTRLRunError(Exception):
    """Base class of every ctrlrun error."""

    def __init__(self, *args: object, receipt_id: str | None = None) -> None:
        super().__init__(*args)
        self.receipt_id = receipt_id  # the receipt that records this refusal, if one was written


class InvalidArgument(CTRLRunError):
    """A value ctrlrun cannot accept."""


class PolicyError(CTRLRunError):
    """A policy that cannot be loaded or validated."""


class EffectKeyError(CTRLRunError):
    """An effect template that cannot be resolved for this call."""


class ActionDenied(CTRLRunError):
    """The policy, or the absence of a principal, refuses the action."""

    def __init__(
        self,
        reason: str,
        message: str | None = None,
        *,
        action_id: str | None = None,
        receipt_id: str | None = None,
    ):
        super().__init__(message or reason, receipt_id=receipt_id)
        self.reason = reason
        self.action_id = action_id


class ActionFrozen(ActionDenied):
    """An operator froze this action (``ctrlrun freeze``): nothing is done until it is lifted.

    Its ``reason`` is ``frozen``; its message names who froze it and why.
    """

    def __init__(
        self,
        message: str = "frozen",
        *,
        action_id: str | None = None,
        receipt_id: str | None = None,
    ):
        super().__init__("frozen", message, action_id=action_id, receipt_id=receipt_id)


class BudgetExceeded(ActionDenied):
    """The action's ``budget:`` has too little left in this window for what it asks.

    Its ``reason`` is ``budget_exceeded``; its message names the budget and what is left.
    """

    def __init__(
        self,
        message: str = "budget_exceeded",
        *,
        action_id: str | None = None,
        receipt_id: str | None = None,
    ):
        super().__init__("budget_exceeded", message, action_id=action_id, receipt_id=receipt_id)


class ApprovalRequired(CTRLRunError):
    """The policy wants a human to approve this action first."""

    def __init__(
        self,
        request_id: str,
        message: str | None = None,
        *,
        action_id: str | None = None,
        receipt_id: str | None = None,
        resend: bool = False,
    ):
        how = (
            "then call again with the identical arguments (or retry inside "
            f"ctrlrun.with_approval('{request_id}'))"
            if resend
            else f"then retry inside ctrlrun.with_approval('{request_id}')"
        )
        super().__init__(
            message or f"approval required: run 'ctrlrun approve {request_id}', {how}",
            receipt_id=receipt_id,
        )
        self.request_id = request_id
        self.action_id = action_id
        # True: the identical action, re-sent once approved, consumes the approval without
        # naming it; False: the policy says ``approval: header``, so it must be presented.
        self.resend = resend


class ApprovalMismatch(CTRLRunError):
    """The approval presented cannot be used for this action."""

    def __init__(
        self,
        reason: str,
        message: str | None = None,
        *,
        approval_id: str | None = None,
        receipt_id: str | None = None,
    ):
        super().__init__(
            message or f"approval {approval_id or ''} refused: {reason}".replace("  ", " "),
            receipt_id=receipt_id,
        )
        self.reason = reason
        self.approval_id = approval_id


class ApprovalTimeout(CTRLRunError):
    """Nobody answered an approval request in time."""

    def __init__(
        self, request_id: str, message: str | None = None, *, receipt_id: str | None = None
    ):
        super().__init__(
            message or f"approval {request_id} was not answered in time", receipt_id=receipt_id
        )
        self.request_id = request_id


class DuplicateEffect(CTRLRunError):
    """The effect is already committed, or another attempt holds it."""

    def __init__(
        self,
        message: str | None = None,
        *,
        state: str,
        effect_key: str | None = None,
        action_id: str | None = None,
        receipt_id: str | None = None,
    ):
        if message is None:
            if state == "committed":
                message = f"effect {effect_key!r} was already committed by {action_id}"
            else:
                message = f"effect {effect_key!r} is executing under {action_id}"
        super().__init__(message, receipt_id=receipt_id)
        self.state = state
        self.effect_key = effect_key
        self.action_id = action_id


class AmbiguousEffect(CTRLRunError):
    """Nobody knows whether the effect happened; a blind retry is refused."""

    def __init__(
        self,
        effect_key: str,
        message: str | None = None,
        *,
        action_id: str | None = None,
        receipt_id: str | None = None,
    ):
        super().__init__(
            message
            or f"effect {effect_key!r} has an unknown outcome from {action_id}; resolve it with "
            f"'ctrlrun resolve {effect_key}' before retrying",
            receipt_id=receipt_id,
        )
        self.effect_key = effect_key
        self.action_id = action_id


class NotExecuted(CTRLRunError):
    """Raised by an executor to assert that the remote certainly did nothing."""


class StoreError(CTRLRunError):
    """The ledger could not be read or written."""


class ConnectionLost(StoreError):
    """The connection died before the transaction's COMMIT was sent: nothing was written (or,
    for a statement sent as its own transaction, perhaps it was; the message says which).
    The store runs the transaction once more on a new connection."""


class OutcomeUnknown(StoreError):
    """The connection was lost after a COMMIT was sent: what it wrote may be recorded or not.
    Never run again blind (a second run would record over the first); the record stays as
    the ledger has it, under its lease until then."""


class SchemaMismatch(StoreError):
    """The ledger's schema is newer than this code, or not a ctrlrun schema at all."""


class MissingDependency(CTRLRunError):
    """An optional extra is not installed."""

    def __init__(self, module: str, extra: str, *, receipt_id: str | None = None):
        super().__init__(
            f"{module!r} is not installed; it ships in the {extra!r} extra: "
            f"pip install 'ctrlrun[{extra}]'",
            receipt_id=receipt_id,
        )
        self.module = module
        self.extra = extra
