"""The sweep's schedule: who is asked when, what is recorded, and who may ask (checks.py)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import update
from sweep_support import POLICY, Clock, Remote, event_count, events_of, record, stuck

from ctrlrun import Control, Policy, SQLiteStateStore
from ctrlrun.action import iso, parse_iso
from ctrlrun.checks import BACKOFF, Backoff, Schedule, answer_label, schedule_of
from ctrlrun.reconcilers.base import EffectFacts
from ctrlrun.reconcilers.sweep import sweep
from ctrlrun.schema import effects

# The wait after each ask, with no jitter: 30 s doubling to the hour.
NO_JITTER = Backoff(jitter=0.0)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def control(tmp_path: Path, clock: Clock) -> Iterator[Control]:
    store = SQLiteStateStore(tmp_path / "state.db")
    ctl = Control(Policy.from_yaml(POLICY), store, clock=clock)
    ctl.reconciler.backoff = NO_JITTER
    yield ctl
    store.close()


@pytest.mark.parametrize(
    ("checks", "seconds"),
    [(1, 30), (2, 60), (3, 120), (4, 240), (7, 1920), (8, 3600), (9, 3600), (10_000, 3600)],
)
def test_the_wait_doubles_from_30_seconds_to_an_hour(checks: int, seconds: float) -> None:
    assert NO_JITTER.delay(checks, 0.5) == timedelta(seconds=seconds)
    assert BACKOFF.delay(checks, 0.0) == timedelta(seconds=seconds)


@given(st.integers(min_value=1, max_value=10**6), st.floats(min_value=0.0, max_value=1.0))
def test_jitter_only_shortens_the_wait_by_up_to_a_fifth(checks: int, rand: float) -> None:
    full = NO_JITTER.delay(checks, rand)
    wait = BACKOFF.delay(checks, rand)
    assert full * 0.8 <= wait <= full <= BACKOFF.cap


@pytest.mark.parametrize(
    ("data", "label"),
    [
        ({"outcome": "unknown"}, "unknown"),
        ({"outcome": "unknown", "reason": "raised", "error": "ConnectError: x"}, "unknown:raised"),
        ({"outcome": "unknown", "reason": "raised", "error": "ReadTimeout: y"}, "unknown:raised"),
        ({"outcome": "committed"}, "committed"),
    ],
)
def test_an_answer_is_its_outcome_and_reason_not_its_wording(
    data: dict[str, Any], label: str
) -> None:
    assert answer_label(data) == label


def test_a_schedule_belongs_to_one_attempt() -> None:
    row = {"attempt": 2, "checks": 5, "check_answer": "unknown", "check_attempt": 1}
    assert schedule_of(row) == Schedule()  # a renewed attempt is asked about afresh
    row["check_attempt"] = 2
    row["next_check_at"] = "2026-01-01T00:00:00.000Z"
    assert schedule_of(row) == Schedule(5, "unknown", parse_iso("2026-01-01T00:00:00.000Z"))


def test_an_unknown_answer_waits_its_turn_and_is_recorded_once(
    control: Control, clock: Clock
) -> None:
    (key,) = stuck(control.store, 1, clock.now)
    remote = Remote("unknown")
    assert sweep(control, {"kube": remote}) == [(key, "unknown")]
    rec = record(control.store, key)
    assert (rec["checks"], rec["check_answer"], rec["check_attempt"]) == (1, "unknown", 1)
    assert parse_iso(rec["next_check_at"]) == clock.now + timedelta(seconds=30)
    written = event_count(control.store)

    clock.advance(29)
    assert sweep(control, {"kube": remote}) == []  # not due yet
    clock.advance(1)
    assert sweep(control, {"kube": remote}) == [(key, "unknown")]
    assert remote.asked[key] == 2
    rec = record(control.store, key)
    assert rec["checks"] == 2
    assert parse_iso(rec["next_check_at"]) == clock.now + timedelta(seconds=60)
    assert event_count(control.store) == written  # the same answer: nothing new to record
    assert [t for t, _ in events_of(control.store, key)] == [
        "RECONCILIATION_STARTED",
        "RECONCILIATION_RESOLVED",
    ]
    assert rec["updated_at"] == record(control.store, key)["updated_at"]  # asks move nothing


def test_each_change_of_answer_is_recorded(control: Control, clock: Clock) -> None:
    (key,) = stuck(control.store, 1, clock.now)
    answers: list[Any] = ["unknown", OSError("refused"), OSError("timed out"), "committed"]

    def answer(facts: EffectFacts) -> Any:
        found = answers.pop(0)
        if isinstance(found, BaseException):
            raise found
        return found

    for _ in range(4):
        clock.advance(3600)
        assert len(sweep(control, {"kube": Remote(answer)})) == 1
    seen = [
        (t, d.get("outcome"), d.get("reason"), d.get("check"))
        for t, d in events_of(control.store, key)
    ]
    assert seen == [
        ("RECONCILIATION_STARTED", None, None, 1),
        ("RECONCILIATION_RESOLVED", "unknown", None, None),
        ("RECONCILIATION_STARTED", None, None, 2),
        ("RECONCILIATION_RESOLVED", "unknown", "raised", None),
        # the third ask raised again (other words, same answer): not recorded
        ("RECONCILIATION_STARTED", None, None, 4),
        ("RECONCILIATION_RESOLVED", "committed", None, None),
        ("EFFECT_RESOLVED", None, None, None),
    ]
    rec = record(control.store, key)
    assert (rec["state"], rec["checks"], rec["check_answer"]) == ("committed", 4, "committed")
    assert rec["next_check_at"] is None  # nothing left to ask about


def test_not_executed_fails_the_record(control: Control, clock: Clock) -> None:
    (key,) = stuck(control.store, 1, clock.now)
    assert sweep(control, {"kube": Remote("not_executed")}) == [(key, "not_executed")]
    assert record(control.store, key)["state"] == "failed"


def test_a_human_asks_now_whatever_the_schedule(control: Control, clock: Clock) -> None:
    one, two = stuck(control.store, 2, clock.now)
    remote = Remote("unknown")
    sweep(control, {"kube": remote})
    before = event_count(control.store)
    assert sweep(control, {"kube": remote}) == []  # the sidecar's sweep: nothing is due

    assert sweep(control, {"kube": remote}, keys=[two]) == [(two, "unknown")]
    assert sweep(control, {"kube": remote}, ask_now=True) == [(one, "unknown"), (two, "unknown")]
    assert remote.asked == {one: 2, two: 3}
    assert event_count(control.store) == before + 3 * 2  # a human's ask is always recorded
    rec = record(control.store, two)
    assert rec["checks"] == 3
    # Each ask pushes the next check back, a human's too.
    assert parse_iso(rec["next_check_at"]) == clock.now + timedelta(seconds=120)


def test_a_named_effect_that_is_not_ambiguous_is_reported(control: Control, clock: Clock) -> None:
    (key,) = stuck(control.store, 1, clock.now)
    sweep(control, {"kube": Remote("committed")})
    assert sweep(control, {"kube": Remote()}, keys=[key]) == [(key, "not ambiguous (committed)")]
    assert sweep(control, {"kube": Remote()}, keys=["scale:nobody:x:1"]) == []
    (other,) = stuck(control.store, 1, clock.now, upstream="stripe", prefix="pay")
    assert sweep(control, {"kube": Remote()}, keys=[other]) == [
        (other, "no reconciler for this effect")
    ]


def test_the_oldest_due_are_asked_first_and_none_is_starved(control: Control, clock: Clock) -> None:
    keys = stuck(control.store, 5, clock.now)
    remote = Remote("unknown")
    assert [k for k, _ in sweep(control, {"kube": remote}, limit=2)] == keys[:2]
    clock.advance(30)
    # Never asked comes before asked again, however long the first two have been due.
    assert [k for k, _ in sweep(control, {"kube": remote}, limit=2)] == keys[2:4]
    clock.advance(30)
    assert [k for k, _ in sweep(control, {"kube": remote}, limit=2)] == [keys[4], keys[0]]


def test_effects_this_sidecar_cannot_ask_about_take_no_place(
    control: Control, clock: Clock
) -> None:
    theirs = stuck(control.store, 5, clock.now - timedelta(hours=1), upstream="stripe", prefix="p")
    (mine,) = stuck(control.store, 1, clock.now)
    remote = Remote("unknown")
    # The older effects of an upstream with no reconciler here neither fill the limit nor are
    # claimed: the sidecar that has their reconciler asks about them on its own schedule.
    assert sweep(control, {"kube": remote, "stripe": None}, limit=1) == [(mine, "unknown")]
    assert all(record(control.store, k)["checks"] is None for k in theirs)


def test_an_attempts_own_ask_counts_and_pushes_the_sweep_back(
    control: Control, clock: Clock
) -> None:
    (key,) = stuck(control.store, 1, clock.now)
    assert control.reconciler.run(key, lambda _k: "unknown", trigger="eager") == "unknown"
    rec = record(control.store, key)
    assert (rec["checks"], rec["check_answer"]) == (1, "unknown")
    remote = Remote("unknown")
    assert sweep(control, {"kube": remote}) == []  # asked a moment ago
    written = event_count(control.store)
    clock.advance(30)
    assert sweep(control, {"kube": remote}) == [(key, "unknown")]
    assert event_count(control.store) == written  # the eager ask recorded that answer


def test_a_renewed_attempt_is_asked_about_afresh(control: Control, clock: Clock) -> None:
    (key,) = stuck(control.store, 1, clock.now)
    remote = Remote("unknown")
    sweep(control, {"kube": remote})
    # The record left AMBIGUOUS, was renewed and became ambiguous again as attempt 2 (written
    # here directly: what the kernel's renewal leaves behind of attempt 1's schedule).
    with control.store.transaction() as conn:
        conn.execute(update(effects).values(attempt=2, next_check_at=None))
    assert sweep(control, {"kube": remote}) == [(key, "unknown")]
    rec = record(control.store, key)
    assert (rec["checks"], rec["check_attempt"]) == (1, 2)
    resolved = [d for t, d in events_of(control.store, key) if t == "RECONCILIATION_RESOLVED"]
    assert len(resolved) == 2  # attempt 2's first answer is news


def test_an_answer_about_a_record_resolved_meanwhile_moves_nothing(
    control: Control, clock: Clock
) -> None:
    (key,) = stuck(control.store, 1, clock.now)

    def human_first(facts: EffectFacts) -> str:
        control.resolve(facts.effect_key, "failed", resolved_by="cli:ops")
        return "committed"

    assert sweep(control, {"kube": Remote(human_first)}) == [(key, "committed")]
    rec = record(control.store, key)
    assert (rec["state"], rec["resolved_by"]) == ("failed", "cli:ops")  # the human's stands
    assert [t for t, _ in events_of(control.store, key)][-2:] == [
        "RECONCILIATION_STARTED",
        "RECONCILIATION_RESOLVED",
    ]


def test_a_check_claimed_by_another_sidecar_is_not_asked_again(
    control: Control, clock: Clock
) -> None:
    (key,) = stuck(control.store, 1, clock.now)
    with control.store.reading() as conn:
        from ctrlrun import checks

        (row,) = checks.due(conn, clock.now, {"kube"}, 10)
    # Two sidecars read the same due record; the first claims the check and asks.
    first, second = Remote("unknown"), Remote("unknown")
    assert control.reconciler.check(row, lambda k: first(_facts(k)), trigger="sweep", force=False)
    assert (
        control.reconciler.check(row, lambda k: second(_facts(k)), trigger="sweep", force=False)
        is None
    )
    assert (first.asked[key], second.asked[key]) == (1, 0)
    assert record(control.store, key)["checks"] == 1


def test_the_clock_of_the_schedule_is_the_ledgers_text(control: Control, clock: Clock) -> None:
    # next_check_at is compared as text: the fixed-width ISO form orders like the time.
    (key,) = stuck(control.store, 1, clock.now)
    sweep(control, {"kube": Remote()})
    assert record(control.store, key)["next_check_at"] == iso(clock.now + timedelta(seconds=30))


def _facts(key: str) -> EffectFacts:
    return EffectFacts(key, "k8s.scale", {}, parse_iso("2026-01-01T00:00:00.000Z"))
