"""Approvals: bound to one action hash, single use, expiring."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from .action import Action, iso, new_id, parse_iso
from .errors import ActionDenied, ApprovalMismatch, InvalidArgument
from .events import EventType
from .ledger import append_event, approval_row, insert_approval, move_approval

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


def request_approval(
    conn: Connection, action: Action, now: datetime, ttl: timedelta, policy_hash: str
) -> str:
    request_id = new_id("apr")
    insert_approval(
        conn,
        {
            "approval_id": request_id,
            "action_hash": action.hash,
            "status": "pending",
            "action_json": json.dumps(action.canonical_document(), sort_keys=True),
            "created_at": iso(now),
            "expires_at": iso(now + ttl),
            "policy_hash": policy_hash,
        },
    )
    append_event(
        conn,
        now,
        EventType.APPROVAL_REQUESTED,
        action_id=action.action_id,
        approval_id=request_id,
        data={"action_hash": action.hash, "expires_at": iso(now + ttl)},
    )
    return request_id


def consume(conn: Connection, approval_id: str, action: Action, now: datetime) -> Approval:
    """Consume a granted approval for ``action`` or raise why not (records the refusal)."""
    row = approval_row(conn, approval_id)
    reason = check_consumable(row, approval_id, action.hash, now)
    if reason == "denied":
        raise ActionDenied(
            "approval_denied", f"{action.name} denied: approval {approval_id} was denied"
        )
    if reason is not None:
        if (
            reason == "expired"
            and row is not None
            and move_approval(conn, approval_id, old="granted", new="expired", values={})
        ):
            append_event(
                conn,
                now,
                EventType.APPROVAL_EXPIRED,
                action_id=action.action_id,
                approval_id=approval_id,
            )
        raise ApprovalMismatch(reason, approval_id=approval_id)
    assert row is not None
    if not move_approval(
        conn, approval_id, old="granted", new="consumed", values={"consumed_at": iso(now)}
    ):
        raise ApprovalMismatch("consumed", approval_id=approval_id)
    return Approval(approval_id, action.hash, row["approver"])


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
