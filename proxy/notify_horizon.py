"""How far a webhook's cursor may go: never past an event id that may still commit.

On PostgreSQL an event's id comes from a sequence when its ``INSERT`` runs, but transactions
commit in their own order::

    writer A   INSERT -> id 11 ........................ COMMIT
    writer B        INSERT -> id 12  COMMIT
    notifier                              reads 12, cursor := 12     (11 lost for ever)

So the cursor stops below the first missing id (a *gap*) until that gap is settled: filled
(its event is visible and is sent, in order), or proven dead (its transaction rolled back,
or a sequence value was drawn and never used). A gap is dead once every transaction that may
hold it has ended. Its id was drawn before the gap was first seen (a higher id was already
visible), and the transaction that drew it has an xid from the moment its ``INSERT`` wrote the
row, one statement later at the latest; so, ``GRACE`` after the gap was first seen, the
notifier notes the next xid to be assigned (``pg_snapshot_xmax``), and the gap is dead when
the oldest running transaction is younger than that (``pg_snapshot_xmin`` of that snapshot
or a later one). That test is exact and quick: a rolled-back id is passed about ``GRACE`` after it
is seen. Only the window between drawing the id and writing the row, inside one ``INSERT``,
is covered by time, and ``GRACE`` is far longer than that statement takes.

The oldest running transaction is the whole server's, so a session that is not the ledger's
(another database, a ``psql`` left on ``BEGIN``) can hold the exact test back. A gap is then
also passed, with a warning, once it has been seen for ``limit``: longer than a ledger
transaction can stay open under the limits its sessions run with (``pg_session.py``: no
statement longer than ``statement_timeout``, never idle in a transaction longer than
``idle_in_transaction_session_timeout``; a decision is a handful of statements back to back).

Why not a commit-ordered column or a per-event delivered marker: both change the events table
every writer shares (a migration, and a write per delivery), for what this read-side check
gives with the schema as it is (the snapshot functions need PostgreSQL 13 or later). SQLite
has one writer at a time (``BEGIN IMMEDIATE``): ids commit in order, there is never a gap to
wait for, and none of this runs.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlalchemy import Connection, text

log = logging.getLogger(__name__)
GRACE = 1.0  # seconds: far longer than one INSERT takes between its nextval and its row
SCAN = 1000  # ids looked at per poll: the cursor goes at most this far in one step
FALLBACK_LIMIT = 300.0  # seconds, when a session limit is off ("0")
_DURATION = re.compile(r"(\d+)\s*(ms|s|min)?")
_UNIT = {None: 0.001, "ms": 0.001, "s": 1.0, "min": 60.0}


def seconds(value: str) -> float | None:
    """A PostgreSQL duration setting in seconds (``5s``, ``500``, ``1min``); None when off."""
    m = _DURATION.fullmatch(value.strip())
    if m is None or int(m.group(1)) == 0:
        return None
    return int(m.group(1)) * _UNIT[m.group(2)]


def limit_for(timeouts: Mapping[str, str]) -> float:
    """How long a gap is waited for at most, from the ledger's session limits."""
    statement = seconds(timeouts.get("statement_timeout", "0"))
    idle = seconds(timeouts.get("idle_in_transaction_session_timeout", "0"))
    if statement is None or idle is None:
        return FALLBACK_LIMIT
    return max(60.0, 4 * (statement + idle))


@dataclass
class _Gap:
    seen: float  # monotonic time it was first seen
    xmax: int | None = None  # the next xid, noted GRACE after it was seen


class Horizon:
    """Per webhook: the highest event id below which every id is visible or dead."""

    def __init__(
        self,
        *,
        grace: float = GRACE,
        limit: float = FALLBACK_LIMIT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.grace, self.limit, self.clock = grace, limit, clock
        self._gaps: dict[tuple[str, int], _Gap] = {}

    def safe(self, conn: Connection, target: str, last: int, high: int) -> int:
        """The highest id in ``(last, high]`` the cursor of ``target`` may reach (or ``last``)."""
        if high <= last or conn.dialect.name != "postgresql":
            return high
        self._forget(target, last)
        ids = conn.execute(
            text(
                "SELECT event_id FROM events WHERE event_id > :last AND event_id <= :high "
                "ORDER BY event_id LIMIT :n"
            ),
            {"last": last, "high": high, "n": SCAN},
        ).scalars()
        expected = last + 1
        for found in ids:
            if found != expected and not self._dead(conn, target, expected, found - 1):
                return expected - 1
            expected = found + 1
        return high if expected > high else expected - 1

    def start(self, conn: Connection, high: int) -> int:
        """Where a new webhook's cursor begins: at the newest visible event ``high``, unless an
        id below it is missing while a transaction runs that may still commit it. The cursor
        then begins below the lowest such id among the last ``SCAN``, and the gap is waited for
        as any other (events from just before the webhook existed may be sent, at most ``SCAN``;
        an event committed just after would otherwise never be)."""
        if high <= 0 or conn.dialect.name != "postgresql":
            return high
        ids = list(
            conn.execute(
                text(
                    "SELECT event_id FROM events WHERE event_id <= :high "
                    "ORDER BY event_id DESC LIMIT :n"
                ),
                {"high": high, "n": SCAN},
            ).scalars()
        )
        present, lowest = set(ids), min(ids, default=high)
        missing = next((i for i in range(lowest, high) if i not in present), None)
        if missing is None:
            return high
        running = conn.execute(
            text("SELECT count(*) FROM pg_snapshot_xip(pg_current_snapshot())")
        ).scalar()
        return missing - 1 if running else high  # nothing running: every gap is dead

    def _dead(self, conn: Connection, target: str, first: int, end: int) -> bool:
        gap = self._gaps.setdefault((target, first), _Gap(self.clock()))
        age = self.clock() - gap.seen
        if age >= self.limit:
            log.warning(
                "notify: event ids %s..%s never committed within %.0f s; passing them",
                first,
                end,
                self.limit,
            )
            return True
        if age < self.grace:
            return False
        row = conn.execute(
            text(
                "SELECT pg_snapshot_xmin(s)::text, pg_snapshot_xmax(s)::text "
                "FROM pg_current_snapshot() AS s"
            )
        ).one()
        if gap.xmax is None:
            gap.xmax = int(row[1])
        return int(row[0]) >= gap.xmax

    def _forget(self, target: str, last: int) -> None:
        for key in [k for k in self._gaps if k[0] == target and k[1] <= last]:
            del self._gaps[key]
