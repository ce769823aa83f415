"""What a sidecar's sweep costs over effects stuck AMBIGUOUS: asks made and events written.

The figures of the issue: 150 effects whose remote keeps answering ``unknown``, swept every
60 s (the sidecar's default ``--sweep-interval``) ten times.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sweep_support import POLICY, Clock, Remote, event_count, stuck

from ctrlrun import Control, Policy, SQLiteStateStore
from ctrlrun.reconcilers.sweep import sweep

STUCK = 150
SWEEPS = 10
INTERVAL = 60.0  # seconds: the sidecar's default --sweep-interval
PER_DAY = 86_400 / INTERVAL


@pytest.fixture
def ledger(tmp_path: Path) -> SQLiteStateStore:
    return SQLiteStateStore(tmp_path / "state.db")


def sweeps(control: Control, clock: Clock, remote: Remote, n: int) -> int:
    """Run ``n`` sweeps, one interval apart; returns the events they wrote."""
    before = event_count(control.store)
    for _ in range(n):
        clock.advance(INTERVAL)
        sweep(control, {"kube": remote})
    return event_count(control.store) - before


def test_ten_sweeps_over_150_stuck_effects_ask_every_one_and_record_each_answer_once(
    ledger: SQLiteStateStore,
) -> None:
    # Before the schedule: 1,000 asks about the same 100 (the 50 oldest never asked) and
    # 2,000 events, 200 a sweep: 288,000 a day per sidecar.
    clock = Clock()
    control = Control(Policy.from_yaml(POLICY), ledger, clock=clock)
    keys = stuck(ledger, STUCK, clock.now)
    remote = Remote()
    written = sweeps(control, clock, remote, SWEEPS)
    asks = sum(remote.asked.values())
    figures = (
        f"{SWEEPS} sweeps over {STUCK} stuck effects: {asks} asks about {len(remote.asked)} "
        f"effects, {written} events"
    )
    print(figures)
    # Nobody is starved: the oldest are asked too.
    assert set(remote.asked) == set(keys), figures
    # An unchanged answer is recorded once: a STARTED and a RESOLVED per effect, at its first.
    assert written == 2 * STUCK, figures
    # Backoff (30 s doubling): an effect is asked at most 6 times in its first 10 minutes.
    assert max(remote.asked.values()) <= 6, figures
    assert asks < SWEEPS * 100, figures


@pytest.mark.slow
def test_a_day_of_sweeps_over_stuck_effects(ledger: SQLiteStateStore) -> None:
    # Before the schedule, a day over 150 stuck effects was 144,000 asks and 288,000 events.
    clock = Clock()
    control = Control(Policy.from_yaml(POLICY), ledger, clock=clock)
    n = 20
    stuck(ledger, n, clock.now)
    remote = Remote()
    written = sweeps(control, clock, remote, int(PER_DAY))
    asks = sum(remote.asked.values())
    print(f"a day of sweeps over {n} stuck effects: {asks} asks, {written} events")
    assert written == 2 * n  # the first answers only: nothing changed all day
    # Doubling to the hour takes 8 asks (30 s .. 64 min); then about one an hour.
    assert all(25 <= n <= 40 for n in remote.asked.values()), remote.asked.most_common(3)
