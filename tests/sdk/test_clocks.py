"""The ledger's clock: the database's time carried on the monotonic clock; the test offset."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from ctrlrun import clocks, config
from ctrlrun.clocks import LedgerClock
from ctrlrun.errors import InvalidArgument

DB = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


class Fake:
    """A database clock, a monotonic clock and a wall clock that the test moves."""

    def __init__(self, wall_ahead: float) -> None:
        self.mono = 100.0
        self.db = DB
        self.wall_ahead = wall_ahead
        self.reads = 0
        self.broken = False

    def read(self) -> datetime:
        if self.broken:
            raise OSError("the database went away")
        self.reads += 1
        return self.db

    def wall(self) -> datetime:
        return self.db + timedelta(seconds=self.wall_ahead)

    def tick(self, seconds: float) -> None:
        self.mono += seconds
        self.db += timedelta(seconds=seconds)


def test_decisions_read_the_databases_time_not_this_hosts() -> None:
    fake = Fake(wall_ahead=120)
    clock = LedgerClock(fake.read, every=30, monotonic=lambda: fake.mono, wall=fake.wall)
    assert clock() == DB
    fake.tick(10)
    assert clock() == DB + timedelta(seconds=10) and fake.reads == 1  # no round trip
    fake.tick(25)
    assert clock() == DB + timedelta(seconds=35) and fake.reads == 2  # read again after 30 s
    assert clock.skew is not None and clock.skew.seconds == 120 and clock.skew.beyond


def test_a_failed_read_keeps_the_last_reading() -> None:
    fake = Fake(wall_ahead=0)
    clock = LedgerClock(fake.read, every=1, monotonic=lambda: fake.mono, wall=fake.wall)
    fake.broken = True
    fake.tick(5)
    assert clock() == DB + timedelta(seconds=5)
    assert clock.skew is not None and not clock.skew.beyond


def test_a_skew_past_the_bound_is_said_once_and_its_end_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = Fake(wall_ahead=5)
    with caplog.at_level(logging.INFO, logger="ctrlrun.clocks"):
        clock = LedgerClock(
            fake.read, every=1, bound=1, monotonic=lambda: fake.mono, wall=fake.wall
        )
        for _ in range(3):
            fake.tick(2)
            clock()
        fake.wall_ahead = 0
        fake.tick(2)
        clock()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "this host's clock is 5.0 s ahead of the ledger's (bound 1.0 s); decisions use the "
        "ledger's clock",
        "this host's clock is 0.0 s ahead of the ledger's: within the bound of 1.0 s again",
    ]


def test_the_offset_shifts_this_hosts_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTRLRUN_CLOCK_OFFSET", "-90")
    clocks._offset.cache_clear()
    try:
        behind = (datetime.now(UTC) - clocks.utc_now()).total_seconds()
        assert 89 < behind < 91
    finally:
        monkeypatch.delenv("CTRLRUN_CLOCK_OFFSET")
        clocks._offset.cache_clear()


@pytest.mark.parametrize("raw", ["soon", "nan", "inf"])
def test_a_bad_offset_or_bound_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv("CTRLRUN_CLOCK_OFFSET", raw)
    monkeypatch.setenv("CTRLRUN_CLOCK_SKEW_BOUND", "-1")
    with pytest.raises(InvalidArgument, match="CTRLRUN_CLOCK_OFFSET"):
        config.clock_offset()
    with pytest.raises(InvalidArgument, match="CTRLRUN_CLOCK_SKEW_BOUND"):
        config.clock_skew_bound()
