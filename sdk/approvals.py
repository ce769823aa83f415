"""Approvals: bound to one action hash, single use, expiring.

Requesting and consuming an approval are part of admission (``admission.py`` plans them,
``writer.py`` writes them); this module checks a row and records a human's answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, insert, select

from .action import iso, parse_iso
from .errors import ApprovalMismatch, InvalidArgument
from .events import EventType
from .ledger import append_event, move_approval
from .schema import approval_votes, approvals

DEFAULT_TTL = timedelta(minutes=15)


@dataclass(frozen=True)
class Approval:
    """A granted approval, as consumed by a reservation."""

    approval_id: str
    action_hash: str
    approver: str | None


def check_consumable(
    row: Mapping[str, Any] | None, approval_id: str, action_hash: str, now: datetime
) -> str | None:
    """Why ``approval_id`` cannot be used for ``action_hash`` now (None: it can). Pure."""
    if row is None:
        return "unknown"
    if row["action_hash"] != action_hash:
        return "mismatch"  # the record stays usable for the action it was granted for
    if row["status"] == "denied":
        return "denied"
    if row["status"] != "granted":
        return str(row["status"])  # pending, consumed, expired
    if now > parse_iso(row["expires_at"]):
        return "expired"
    return None


def answer(
    conn: Connection, approval_id: str, *, grant: bool, approver: str, now: datetime
) -> Mapping[str, Any]:
    """Grant or deny a pending request as operator ``approver``; the row as it now stands.

    A request created with ``approvals_required: N`` is granted once N different operators
    have approved it: until then each approval is a vote and the row stays ``pending`` (the
    answer's ``approvals`` names who approved, ``approvals_required`` how many it needs). One
    deny denies. The request's row is locked first (``FOR UPDATE``), so two operators
    approving at once on PostgreSQL are counted one after the other and exactly one of them
    grants it. ``APPROVAL_GRANTED`` is written once, when the quorum is reached.
    Raises ``ApprovalMismatch`` when the request is not pending or ``approver`` already
    approved it (a second approval by the same operator counts once).
    """
    row = _pending(conn, approval_id, now)
    required = required_of(row)
    before = approvers(conn, approval_id)
    if grant and approver in before:
        raise ApprovalMismatch(
            "already_approved",
            f"{approver} already approved {approval_id} (it counts once): "
            f"{progress(len(before), required)}",
            approval_id=approval_id,
        )
    _vote(conn, approval_id, approver, "grant" if grant else "deny", now)
    names = [*before, approver] if grant else before
    if grant and len(names) < required:
        data = {"approver": approver, "approvals": len(names), "approvals_required": required}
        append_event(conn, now, EventType.APPROVAL_VOTED, approval_id=approval_id, data=data)
        said = f"approved by {approver}: {progress(len(names), required)}"
        return {**row, "approvals": names, "approvals_required": required, "message": said}
    new = "granted" if grant else "denied"
    values: dict[str, Any] = {"approver": ", ".join(names) if grant else approver}
    if grant:
        values["granted_at"] = iso(now)
    if not move_approval(conn, approval_id, old="pending", new=new, values=values):
        raise ApprovalMismatch(  # pragma: no cover (the row is locked)
            "changed",
            f"approval request {approval_id} changed; look again",
            approval_id=approval_id,
        )
    data = {"approver": values["approver"], "action_hash": row["action_hash"]}
    if required > 1 or not grant:
        data["approvers"] = names
    append_event(
        conn,
        now,
        EventType.APPROVAL_GRANTED if grant else EventType.APPROVAL_DENIED,
        approval_id=approval_id,
        data=data,
    )
    return {**row, **values, "status": new, "approvals": names, "approvals_required": required}


def _pending(conn: Connection, approval_id: str, now: datetime) -> Mapping[str, Any]:
    """The request's row, locked; ``ApprovalMismatch`` unless it is pending (expiring it now
    if its time is up)."""
    if not approval_id:
        raise InvalidArgument("an approval request id is required")
    row = _locked_row(conn, approval_id)
    if row is None:
        raise ApprovalMismatch(
            "unknown", f"no approval request {approval_id}", approval_id=approval_id
        )
    status = row["status"]
    if status == "pending" and now > parse_iso(row["expires_at"]):
        move_approval(conn, approval_id, old="pending", new="expired", values={})
        append_event(conn, now, EventType.APPROVAL_EXPIRED, approval_id=approval_id)
        status = "expired"
    if status != "pending":
        raise ApprovalMismatch(
            status,
            f"approval request {approval_id} is {status}, not pending",
            approval_id=approval_id,
        )
    return row


def required_of(row: Mapping[str, Any]) -> int:
    """How many operators must approve (a request from before revision 0017 needs one)."""
    return int(row.get("approvals_required") or 1)


def progress(given: int, required: int) -> str:
    """``1 of 2 approvals; waiting for another operator``."""
    if given >= required:
        return f"{given} of {required} approvals"
    more = "another operator" if required - given == 1 else f"{required - given} more operators"
    return f"{given} of {required} approvals; waiting for {more}"


def approvers(conn: Connection, approval_id: str) -> list[str]:
    """The operators who approved ``approval_id``, in the order they did."""
    query = (
        select(approval_votes.c.operator)
        .where(approval_votes.c.approval_id == approval_id, approval_votes.c.decision == "grant")
        .order_by(approval_votes.c.at, approval_votes.c.operator)
    )
    return [str(name) for name in conn.execute(query).scalars()]


def votes(conn: Connection, approval_id: str) -> list[dict[str, Any]]:
    """Every operator's answer to ``approval_id``, in order."""
    query = select(approval_votes).where(approval_votes.c.approval_id == approval_id)
    rows = conn.execute(query.order_by(approval_votes.c.at, approval_votes.c.operator))
    return [dict(r._mapping) for r in rows]


def _locked_row(conn: Connection, approval_id: str) -> Mapping[str, Any] | None:
    query = select(approvals).where(approvals.c.approval_id == approval_id).with_for_update()
    row = conn.execute(query).first()
    return None if row is None else dict(row._mapping)


def _vote(conn: Connection, approval_id: str, operator: str, decision: str, now: datetime) -> None:
    values = {
        "approval_id": approval_id,
        "operator": operator,
        "decision": decision,
        "at": iso(now),
    }
    conn.execute(insert(approval_votes).values(**values))
