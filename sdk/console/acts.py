"""What an operator does from the console: the same kernel functions the CLI calls, with the
logged-in operator's name as who acted. Each returns the sentence the page shows; a refusal is
a ``CTRLRunError`` whose message the page shows instead."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from ctrlrun import freeze as switch
from ctrlrun.approvals import answer
from ctrlrun.errors import InvalidArgument
from ctrlrun.reconcile import Reconciler
from ctrlrun.store import StateStore

NOTE_MAX = 2000  # characters of a settling note
REASON_MAX = 500  # characters of a freeze's reason


def decide(store: StateStore, request_id: str, *, grant: bool, operator: str) -> str:
    """Approve or deny a pending request (``ctrlrun approve|deny ID --as operator``)."""
    if not request_id:
        raise InvalidArgument("which approval request? (no request id in the form)")
    with store.transaction() as conn:
        row = answer(conn, request_id, grant=grant, approver=operator, now=store.clock())
    return answered(request_id, row, grant=grant, operator=operator)


def answered(request_id: str, row: Mapping[str, Any], *, grant: bool, operator: str) -> str:
    """What the kernel's answer says, in a sentence (a quorum may leave it pending)."""
    status = str(row.get("status") or ("granted" if grant else "denied"))
    said = row.get("message")
    if isinstance(said, str) and said:
        return f"{request_id}: {said}"
    if status == "granted":
        by = row.get("approver") or operator  # with a quorum: every operator who approved
        return (
            f"granted {request_id} by {by}, until {row.get('expires_at')}: the agent may "
            "re-send its request now"
        )
    if status == "denied":
        return f"denied {request_id} by {operator}"
    return f"{request_id}: your answer is recorded ({status})"


def settle(store: StateStore, effect_key: str, state: str, note: str, *, operator: str) -> str:
    """Settle an ambiguous effect (``ctrlrun resolve KEY --committed|--failed``), with a note."""
    if state not in ("committed", "failed"):
        raise InvalidArgument("say what happened: committed or failed")
    if not effect_key:
        raise InvalidArgument("which effect? (no effect key in the form)")
    text = note.strip()
    if not text:
        raise InvalidArgument(
            f"a note is required: say what you checked at the remote before settling {effect_key}"
        )
    if len(text) > NOTE_MAX:
        raise InvalidArgument(f"the note is too long (at most {NOTE_MAX} characters)")
    Reconciler(store, store.clock).resolve(effect_key, state, resolved_by=operator, note=text)
    then = "; a retry of it is now permitted" if state == "failed" else ""
    return f"{effect_key} settled {state} by {operator}{then}"


def freeze(
    store: StateStore,
    action: str,
    reason: str,
    *,
    operator: str,
    known: Collection[str] | None = None,
) -> str:
    """Freeze one action, or every action when ``action`` is empty (``ctrlrun freeze``).

    ``known``: the console's policy's actions. A name outside them is frozen all the same
    (sidecars and SDK processes on the ledger may run other policies), and the sentence says
    so: a typo in a kill switch must not read as done."""
    scope = action.strip() or switch.ALL
    if len(reason) > REASON_MAX:
        raise InvalidArgument(f"the reason is too long (at most {REASON_MAX} characters)")
    with store.transaction() as conn:
        row, receipt = switch.freeze(conn, scope, reason=reason, by=operator, now=store.clock())
    said = f"frozen: {row.message} (receipt {receipt.receipt_id})"
    if known is not None and scope != switch.ALL and scope not in known:
        said += (
            f". Note: the console's policy has no action {scope!r}; if that is a typo, "
            "nothing is frozen: unfreeze it and freeze the right name"
        )
    return said


def unfreeze(store: StateStore, scope: str, *, operator: str) -> str:
    """Lift the freeze of ``scope`` (``*``: every action) (``ctrlrun unfreeze``)."""
    if not scope:
        raise InvalidArgument("which freeze? (no scope in the form)")
    with store.transaction() as conn:
        receipt = switch.unfreeze(conn, scope, by=operator, now=store.clock())
    what = "every action" if scope == switch.ALL else scope
    if receipt is None:
        return f"{what} was not frozen; nothing changed"
    return f"unfrozen: {what} by {operator} (receipt {receipt.receipt_id})"
