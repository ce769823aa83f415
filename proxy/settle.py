"""After forwarding, pure: what the record says, and what the agent is told.

The remote's own answer reaches the agent when it has one to give (a status line arrived and,
unless the record is ambiguous, the body too). Otherwise ctrlrun answers::

    nothing sent (no status, recorded failed)   unavailable          upstream_unreachable
    ambiguous, or the body was cut short         upstream_ambiguous   reconciler: <found>
    the proxy failed while forwarding            upstream_ambiguous   internal_error
    answered, but the ledger did not record it   upstream_ambiguous   outcome_not_recorded
"""

from __future__ import annotations

from ctrlrun.control import Outcome

from .forward import Forwarded
from .prepare import Prepared
from .refusals import Refusal


def record_error(reply: Forwarded, outcome: Outcome) -> str | None:
    """The error kept with the record: the transport's line, else the status if not a commit."""
    return reply.error or (None if outcome == "committed" else f"HTTP {reply.status}")


def unreachable(reply: Forwarded, outcome: Outcome) -> bool:
    """Nothing was sent and the record says so: nothing for a reconciler to find."""
    return reply.status is None and outcome == "failed"


def lost(reply: Forwarded, outcome: Outcome) -> bool:
    """The agent cannot be given the remote's answer: it may or may not have acted."""
    return not unreachable(reply, outcome) and (outcome == "ambiguous" or reply.cut_short)


def verdict(
    prepared: Prepared,
    reply: Forwarded,
    outcome: Outcome,
    receipt_id: str | None,
    found: str | None = None,
) -> Forwarded | Refusal:
    """The remote's reply, or ctrlrun's answer; ``found`` is what a reconciler said (if asked)."""
    error = record_error(reply, outcome)
    action, key = prepared.action.name, prepared.effect_key
    if unreachable(reply, outcome):
        return Refusal(
            "unavailable",
            "upstream_unreachable",
            f"the remote could not be reached ({error}); nothing was sent, "
            "and the attempt is recorded failed",
            action=action,
            effect_key=key,
            receipt_id=receipt_id,
        )
    if lost(reply, outcome):
        found = found or "not asked"
        return Refusal(
            "upstream_ambiguous",
            f"reconciler: {found}",
            f"the remote's reply was lost ({error}); the reconciler found: {found}",
            action=action,
            effect_key=key,
            receipt_id=receipt_id,
        )
    return reply


def failed_forwarding(prepared: Prepared, exc: BaseException) -> Refusal:
    """The proxy itself failed once forwarding began: the request may have left."""
    return Refusal(
        "upstream_ambiguous",
        "internal_error",
        f"the proxy failed while forwarding ({type(exc).__name__}); "
        "the request may have reached the remote",
        action=prepared.action.name,
        effect_key=prepared.effect_key,
    )


def not_recorded(prepared: Prepared, reply: Forwarded, exc: BaseException) -> Refusal:
    """Sent and answered; only recording failed. The record stays executing under its lease,
    so a retry is held."""
    return Refusal(
        "upstream_ambiguous",
        "outcome_not_recorded",
        f"the request was sent and the remote answered {reply.status or reply.error}, "
        f"but the ledger could not record it ({type(exc).__name__})",
        action=prepared.action.name,
        effect_key=prepared.effect_key,
    )
