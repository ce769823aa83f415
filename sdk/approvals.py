"""Approvals: bound to one action hash, single use, expiring.

Requesting and consuming an approval are part of admission (``admission.py`` plans them,
``writer.py`` writes them); this module checks a row and records a human's answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from .action import iso, parse_iso
from .errors import ApprovalMismatch, InvalidArgument
from .events import EventType
from .ledger import append_event, approval_row, move_approval

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
    """Grant or deny a pending request; raise ``ApprovalMismatch`` when it is not pending."""
    if not approval_id:
        raise InvalidArgument("an approval request id is required")
    row = approval_row(conn, approval_id)
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
    values: dict[str, Any] = {"approver": approver}
    if grant:
        values["granted_at"] = iso(now)
    move_approval(
        conn, approval_id, old="pending", new="granted" if grant else "denied", values=values
    )
    append_event(
        conn,
        now,
        EventType.APPROVAL_GRANTED if grant else EventType.APPROVAL_DENIED,
        approval_id=approval_id,
        data={"approver": approver, "action_hash": row["action_hash"]},
    )
    return {**row, **values, "status": "granted" if grant else "denied"}
