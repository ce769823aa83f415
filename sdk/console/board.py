"""What the console's pages show, read from the ledger in one transaction each.

Values only: the pages (``pages.py``) render them, the tests read them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, select

from ctrlrun import ledger
from ctrlrun.action import iso, parse_iso
from ctrlrun.approvals import progress, required_of
from ctrlrun.checks import schedule_of
from ctrlrun.context import idempotency_token_for
from ctrlrun.freeze import Freeze, list_freezes
from ctrlrun.receipts import ChainReport, Receipt, load_receipts, verify_chain
from ctrlrun.schema import AMBIGUOUS, approvals
from ctrlrun.schema import effects as E

from .hints import check_the_remote

RECENT = 50  # receipts on the receipts page
# Receipts each view of the page verifies, newest first: the page's time must not grow with
# the ledger (``ctrlrun receipts --verify-chain`` and ``ctrlrun doctor`` walk all of it).
CHAIN_WALK = 5_000
AMBIGUOUS_SHOWN = 200  # ambiguous effects on their page (the oldest first)


@dataclass(frozen=True)
class Pending:
    """One approval request waiting for an operator."""

    request_id: str
    action: str
    arguments: Mapping[str, Any]
    agent: str
    user: str | None
    created_at: str
    expires_at: str
    expired: bool
    approved_by: tuple[str, ...]
    required: int = 1  # operators who must approve (``approvals_required``)

    @property
    def votes(self) -> str:
        """Who approved so far, and how many more are needed."""
        names = ", ".join(self.approved_by) or "nobody yet"
        if self.required <= 1:
            return names
        return f"{names} ({progress(len(self.approved_by), self.required)})"


@dataclass(frozen=True)
class Unsettled:
    """One ambiguous effect and what to look up before settling it."""

    effect_key: str
    action: str
    arguments: Mapping[str, Any]
    agent: str
    since: str
    attempt: int
    checks: int
    last_answer: str | None
    hint: str


@dataclass(frozen=True)
class Counts:
    """The numbers in the console's navigation bar."""

    pending: int
    ambiguous: int
    frozen: int


def counts(conn: Connection) -> Counts:
    pending = conn.execute(
        select(func.count()).select_from(approvals).where(approvals.c.status == "pending")
    ).scalar_one()
    ambiguous = conn.execute(select(func.count()).select_from(E).where(AMBIGUOUS)).scalar_one()
    return Counts(int(pending), int(ambiguous), len(list_freezes(conn)))


def pending(conn: Connection, now: datetime) -> list[Pending]:
    """Pending approval requests, oldest first (one past its expiry says so)."""
    found = []
    for row in ledger.pending_approvals(conn):
        action = json.loads(row["action_json"])
        principal = action.get("principal") or {}
        found.append(
            Pending(
                request_id=row["approval_id"],
                action=str(action.get("name")),
                arguments=action.get("arguments") or {},
                agent=str(principal.get("agent") or "-"),
                user=principal.get("user"),
                created_at=row["created_at"],
                expires_at=row["expires_at"],
                expired=now > parse_iso(row["expires_at"]),
                approved_by=_approvers(row),
                required=required_of(row),
            )
        )
    return found


def _approvers(row: Mapping[str, Any]) -> tuple[str, ...]:
    """Who has approved a request still pending (more than one where a quorum is needed)."""
    many = row.get("approvers")
    if isinstance(many, list | tuple):
        return tuple(str(a) for a in many)
    return (str(row["approver"]),) if row.get("approver") else ()


def ambiguous(conn: Connection, limit: int = AMBIGUOUS_SHOWN) -> list[Unsettled]:
    """Ambiguous effects, the longest waiting first, each with its "check the remote" hint."""
    stmt = select(E).where(AMBIGUOUS).order_by(E.c.updated_at).limit(limit)
    found = []
    for r in conn.execute(stmt):
        row = dict(r._mapping)
        action = json.loads(row["action_json"]) if row.get("action_json") else {}
        name = str(row.get("action_name") or action.get("name") or "?")
        arguments = action.get("arguments") or {}
        schedule = schedule_of(row)
        found.append(
            Unsettled(
                effect_key=row["effect_key"],
                action=name,
                arguments=arguments,
                agent=str((action.get("principal") or {}).get("agent") or "-"),
                since=row["updated_at"],
                attempt=int(row["attempt"]),
                checks=schedule.checks,
                last_answer=schedule.answer,
                hint=check_the_remote(
                    name,
                    arguments,
                    idempotency_key=_idempotency_key(row, name),
                    upstream=row.get("upstream"),
                ),
            )
        )
    return found


def _idempotency_key(row: Mapping[str, Any], action: str) -> str | None:
    if row.get("idempotency_key"):
        return str(row["idempotency_key"])
    if action.startswith("stripe.") and row.get("upstream"):
        # The proxy injects this token when the agent's request carried no key of its own.
        return idempotency_token_for(row["effect_key"], int(row["attempt"]))
    return None


def receipts(conn: Connection, last: int = RECENT) -> tuple[list[Receipt], ChainReport]:
    """The newest receipts, newest first, and what a walk of the newest ``CHAIN_WALK`` found."""
    recent = load_receipts(conn, last=last)
    recent.reverse()
    return recent, verify_chain(conn, newest=CHAIN_WALK)


def freezes(conn: Connection) -> list[Freeze]:
    return list_freezes(conn)


def shown_time(text: str | None) -> str:
    """A ledger timestamp as a person reads it (to the second, UTC)."""
    if not text:
        return "-"
    try:
        return iso(parse_iso(text))[:19].replace("T", " ") + " UTC"
    except ValueError:
        return text
