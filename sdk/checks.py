"""When to ask a remote again about an AMBIGUOUS effect, and which sidecar asks.

Each ambiguous attempt carries its schedule on its record (revision 0004): ``next_check_at``,
the number of ``checks`` made, the last ``check_answer`` recorded, and the ``check_attempt``
they describe (a renewed attempt that becomes ambiguous again starts a fresh schedule).

A sweep asks only about effects that are due, soonest first, so the oldest are never starved;
after each ``unknown`` the wait doubles from 30 s to a cap of an hour, cut by a random part so
that effects ambiguated together (an outage) spread out. Several sidecars share one ledger:
each claims a check with a compare-and-set on ``next_check_at`` before it asks, so one sidecar
asks about an effect per slot. A human asking (``ctrlrun reconcile``) claims without comparing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, case, func, select, update

from .action import iso, parse_iso
from .schema import AMBIGUOUS
from .schema import effects as E


@dataclass(frozen=True)
class Backoff:
    """The wait after the n-th ask that learned nothing: doubling from ``first`` to ``cap``."""

    first: timedelta = timedelta(seconds=30)
    cap: timedelta = timedelta(hours=1)
    jitter: float = 0.2  # the wait is cut by up to this part of it, at random

    def delay(self, checks: int, rand: float) -> timedelta:
        """The wait after ``checks`` asks (``checks >= 1``); ``rand`` is uniform in [0, 1)."""
        # Cut, never lengthened: the cap is a promise to whoever waits for an answer.
        base: timedelta = min(self.cap, self.first * 2 ** min(max(checks, 1) - 1, 30))
        return base * (1.0 - self.jitter * min(max(rand, 0.0), 1.0))


BACKOFF = Backoff()
SCHEDULE_COLUMNS = ("next_check_at", "checks", "check_answer", "check_attempt")


@dataclass(frozen=True)
class Schedule:
    """How often an ambiguous attempt was asked about, what was recorded, when it is due."""

    checks: int = 0
    answer: str | None = None
    next_check_at: datetime | None = None  # None: due now


def schedule_of(row: Mapping[str, Any]) -> Schedule:
    """The schedule a record's columns give for its current attempt."""
    if row.get("check_attempt") != row["attempt"]:
        return Schedule()
    due = row.get("next_check_at")
    return Schedule(int(row.get("checks") or 0), row.get("check_answer"), _ts(due))


def answer_label(data: Mapping[str, Any]) -> str:
    """What counts as the same answer twice: the outcome and why, not the error's wording."""
    reason = data.get("reason")
    return f"{data['outcome']}:{reason}" if reason else str(data["outcome"])


def due(
    conn: Connection, now: datetime, upstreams: Collection[str], limit: int
) -> list[Mapping[str, Any]]:
    """Ambiguous records of these upstreams that are due, never asked first, then soonest due."""
    if not upstreams or limit <= 0:
        return []
    mine = and_(AMBIGUOUS, E.c.upstream.in_(sorted(upstreams)))
    never = select(E).where(mine, E.c.next_check_at.is_(None)).order_by(E.c.updated_at)
    rows: list[Mapping[str, Any]] = [dict(r._mapping) for r in conn.execute(never.limit(limit))]
    if len(rows) < limit:
        soon = select(E).where(mine, E.c.next_check_at <= iso(now))
        soon = soon.order_by(E.c.next_check_at, E.c.updated_at).limit(limit - len(rows))
        rows += [dict(r._mapping) for r in conn.execute(soon)]
    return rows


def ambiguous(conn: Connection, upstreams: Collection[str], limit: int) -> list[Mapping[str, Any]]:
    """Every ambiguous record of these upstreams, due or not, oldest first (a human asking)."""
    if not upstreams or limit <= 0:
        return []
    stmt = select(E).where(AMBIGUOUS, E.c.upstream.in_(sorted(upstreams)))
    return [dict(r._mapping) for r in conn.execute(stmt.order_by(E.c.updated_at).limit(limit))]


def claim(conn: Connection, row: Mapping[str, Any], next_at: datetime, *, force: bool) -> bool:
    """Take the next check of ``row``'s attempt: count it and move its slot to ``next_at``.

    False when the record moved, or (unless ``force``) when another sidecar claimed the slot
    first: its ``next_check_at`` is no longer the one ``row`` was read with.
    """
    this = _same_attempt(row)
    if not force:
        old = row.get("next_check_at")
        this = and_(this, E.c.next_check_at.is_(None) if old is None else E.c.next_check_at == old)
    fresh = E.c.check_attempt == row["attempt"]
    stmt = (
        update(E)
        .where(this)
        .values(
            next_check_at=iso(next_at),
            checks=case((fresh, func.coalesce(E.c.checks, 0) + 1), else_=1),
            check_answer=case((fresh, E.c.check_answer), else_=None),
            check_attempt=row["attempt"],
        )
    )
    return int(conn.execute(stmt).rowcount) == 1


def remember(conn: Connection, row: Mapping[str, Any], label: str) -> None:
    """Record ``label`` as the last answer about ``row``'s attempt (while still ambiguous)."""
    conn.execute(update(E).where(_same_attempt(row)).values(check_answer=label))


def schedules(conn: Connection, keys: Sequence[str]) -> dict[str, Schedule]:
    """The check schedules of these records' current attempts, by effect key."""
    found: dict[str, Schedule] = {}
    columns = [E.c[n] for n in ("effect_key", "attempt", *SCHEDULE_COLUMNS)]
    for i in range(0, len(keys), 500):  # a bounded IN list on either engine
        stmt = select(*columns).where(E.c.effect_key.in_(keys[i : i + 500]))
        found |= {row.effect_key: schedule_of(dict(row._mapping)) for row in conn.execute(stmt)}
    return found


def count_ambiguous_before(conn: Connection, cutoff: datetime) -> int:
    """Ambiguous records that have been so since before ``cutoff``: an index range count.

    ``updated_at`` of an ambiguous record is when it became ambiguous (asks leave it alone),
    and ``effects_by_state`` is ordered by (state, updated_at).
    """
    stmt = select(func.count()).select_from(E)
    stmt = stmt.where(E.c.state == "ambiguous", E.c.updated_at < iso(cutoff))
    return int(conn.execute(stmt).scalar_one())


def _same_attempt(row: Mapping[str, Any]) -> Any:
    return and_(
        E.c.effect_key == row["effect_key"],
        AMBIGUOUS,
        E.c.action_id == row["action_id"],
        E.c.attempt == row["attempt"],
    )


def _ts(value: str | None) -> datetime | None:
    return None if value is None else parse_iso(value)
