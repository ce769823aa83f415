"""The clocks ctrlrun decides by: one notion of time for decisions that span hosts.

- ``utc_now`` is this host's wall clock (shifted by ``$CTRLRUN_CLOCK_OFFSET`` seconds, a test
  switch that stands for a host whose clock is wrong; never set it in production).
- A ledger has a clock, and every decision about a record (is its lease live, is its attempt
  old enough, is a window over) is judged on it: on SQLite, one host, the local clock is the
  ledger's; on PostgreSQL, shared by sidecars on many hosts, it is the database's.
  ``LedgerClock`` reads the database's ``clock_timestamp()`` and carries it forward on this
  process's monotonic clock, so a sidecar whose wall clock is minutes off (or jumps) still
  judges a lease the way every other sidecar does, with no extra round trip per decision.
- Local timeouts (a deadline on a forwarded request, a reconciliation's budget) use
  ``time.monotonic``; they never span hosts.

How far this host's wall clock is from the ledger's is measured at open and on every
re-read; past a bound, it is said at start, in the proxy's ``/readyz`` and in a metric.
Decisions do not depend on it: they never read the wall clock of a PostgreSQL-backed host.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
REREAD_SECONDS = 30.0  # how often the database's clock is read again (monotonic drift: ppm)
DEFAULT_SKEW_BOUND = 1.0  # seconds this host's clock may be from the ledger's before it is said


@functools.cache
def _offset() -> timedelta:
    from .config import clock_offset

    return timedelta(seconds=clock_offset())


def utc_now() -> datetime:
    """This host's wall clock, in UTC."""
    return datetime.now(UTC) + _offset()


@dataclass(frozen=True)
class Skew:
    """How far this host's wall clock was from the ledger's when last measured."""

    seconds: float  # wall minus ledger: positive when this host is ahead
    uncertainty: float  # half the round trip of the measurement
    bound: float

    @property
    def beyond(self) -> bool:
        return abs(self.seconds) - self.uncertainty > self.bound

    def describe(self) -> str:
        side = "ahead of" if self.seconds >= 0 else "behind"
        return f"this host's clock is {abs(self.seconds):.1f} s {side} the ledger's"


class LedgerClock:
    """The database's clock, read every ``every`` seconds and carried on the monotonic clock.

    ``read`` returns the database's time (one ``SELECT clock_timestamp()``). A read that fails
    keeps the last reading: elapsed monotonic time stays right whatever the wall clock does.
    """

    def __init__(
        self,
        read: Callable[[], datetime],
        *,
        every: float = REREAD_SECONDS,
        bound: float = DEFAULT_SKEW_BOUND,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Clock = utc_now,
    ) -> None:
        self._read, self._every, self._bound = read, every, bound
        self._monotonic, self._wall = monotonic, wall
        self._lock = threading.Lock()
        self._anchor: tuple[float, datetime] | None = None
        self.skew: Skew | None = None
        self.measure()  # at open: a database that cannot be read fails the open

    def __call__(self) -> datetime:
        anchor = self._anchor
        now = self._monotonic()
        if anchor is None or now - anchor[0] >= self._every:
            try:
                self.measure()
            except Exception as exc:  # the next decision's own statement will say it failed
                log.debug("cannot read the ledger's clock again: %s", exc)
            anchor = self._anchor
            assert anchor is not None
        return anchor[1] + timedelta(seconds=self._monotonic() - anchor[0])

    def measure(self) -> Skew:
        """Read the database's clock now; returns this host's skew from it."""
        before = self._monotonic()
        wall_before = self._wall()
        db = self._read().astimezone(UTC)
        after = self._monotonic()
        half = (after - before) / 2
        # The database read its clock somewhere within the round trip: call it the middle.
        skew = Skew((wall_before + timedelta(seconds=half) - db).total_seconds(), half, self._bound)
        with self._lock:
            self._anchor = (before + half, db)
            was, self.skew = self.skew, skew
        if skew.beyond and (was is None or not was.beyond):
            log.warning(
                "%s (bound %.1f s); decisions use the ledger's clock", skew.describe(), self._bound
            )
        elif not skew.beyond and was is not None and was.beyond:
            log.info("%s: within the bound of %.1f s again", skew.describe(), self._bound)
        return skew
