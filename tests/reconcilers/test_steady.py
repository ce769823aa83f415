"""A settle window waits on this process's monotonic clock too, where it stamped the attempt.

The ledger's clock on SQLite is the wall clock; a step of it (NTP correcting a clock that was
behind) must not end a window early: "not there" inside it proves nothing.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from ctrlrun import steady
from ctrlrun.reconcile import EffectFacts
from ctrlrun.reconcilers.http import Remote
from ctrlrun.timestamps import stamp

STARTED = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
REMOTE = Remote("http://127.0.0.1:9", write_timeout=30.0, settle_margin=5.0)
ABSENT = ("not_executed", "no such object")


def facts(key: str, wall_now: datetime) -> EffectFacts:
    return EffectFacts(key, "billing.refund", {}, STARTED, attempt=1, clock=lambda: wall_now)


def test_a_step_of_the_wall_clock_does_not_end_the_window_here() -> None:
    steady.note("step:1", 1, stamp(STARTED))
    stepped = facts("step:1", STARTED + timedelta(minutes=2))  # the wall says: long over
    verdict = REMOTE.settle(ABSENT, stepped)
    assert verdict[0] == "unknown"
    assert "settle window" in verdict[1]


def test_the_window_gone_by_on_both_clocks_settles(monkeypatch: pytest.MonkeyPatch) -> None:
    steady.note("went-by:1", 1, stamp(STARTED))
    monkeypatch.setattr(steady, "monotonic", lambda: time.monotonic() + 36)
    assert REMOTE.settle(ABSENT, facts("went-by:1", STARTED + timedelta(seconds=36))) == ABSENT


def test_inside_the_window_on_the_ledger_clock_is_unknown_whatever_the_monotonic() -> None:
    steady.note("inside:1", 1, stamp(STARTED))
    assert REMOTE.settle(ABSENT, facts("inside:1", STARTED + timedelta(seconds=10)))[0] == (
        "unknown"
    )


def test_an_attempt_stamped_elsewhere_is_judged_on_the_ledger_clock() -> None:
    # Another process wrote it: no note here, the ledger's clock decides alone.
    assert REMOTE.settle(ABSENT, facts("elsewhere:1", STARTED + timedelta(minutes=2))) == ABSENT


def test_another_attempt_of_the_key_is_not_this_one() -> None:
    steady.note("renewed:1", 2, stamp(STARTED))
    assert REMOTE.settle(ABSENT, facts("renewed:1", STARTED + timedelta(minutes=2))) == ABSENT


def test_notes_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steady, "KEEP", 3)
    for n in range(5):
        steady.note(f"bounded:{n}", 1, stamp(STARTED))
    assert steady.still_to_wait("bounded:0", 1, STARTED + timedelta(seconds=60)) == 0.0
    assert steady.still_to_wait("bounded:4", 1, STARTED + timedelta(seconds=60)) > 50
