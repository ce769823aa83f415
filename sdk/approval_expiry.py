"""Approval requests whose time ran out with nobody answering: recorded ``expired``.

An unanswered request means no (the agent is never let through on it). Until now it became
``expired`` only when somebody looked at it again (presented it, or answered it late), so
nobody was told when it ran out: a webhook never sent ``approval.expired`` and the queue kept
listing it as pending. ``expire_due`` moves every pending request past its expiry, with an
``APPROVAL_EXPIRED`` event each; the sidecar runs it every few seconds. The move is a
compare-and-set from ``pending``, so of several sidecars on one ledger exactly one records it.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select

from .action import iso
from .events import EventType
from .ledger import append_event, move_approval
from .schema import approvals
from .store import StateStore

BATCH = 200  # requests expired per transaction at most


def expire_due(store: StateStore, now: datetime | None = None) -> list[str]:
    """Expire the pending requests past their time; the ids this call recorded as expired."""
    at = now or store.clock()
    with store.transaction() as conn:
        due = select(approvals.c.approval_id).where(
            approvals.c.status == "pending", approvals.c.expires_at < iso(at)
        )
        expired: list[str] = []
        for approval_id in conn.execute(due.limit(BATCH)).scalars().all():
            if move_approval(conn, approval_id, old="pending", new="expired", values={}):
                append_event(conn, at, EventType.APPROVAL_EXPIRED, approval_id=approval_id)
                expired.append(approval_id)
        return expired
