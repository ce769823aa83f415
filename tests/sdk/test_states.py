"""The effect state machine: the transition table, plan_reservation, lease expiry."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sdk_support import Clock, events

from ctrlrun import (
    Action,
    AmbiguousEffect,
    Control,
    DuplicateEffect,
    EffectState,
    InvalidArgument,
    Principal,
    SQLiteStateStore,
)
from ctrlrun import ledger as L
from ctrlrun.states import (
    TRANSITIONS,
    EffectRecord,
    Refuse,
    Reserve,
    check_transition,
    plan_reservation,
)

S = EffectState
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ALL_PAIRS = list(itertools.product(S, S))
FORBIDDEN = [pair for pair in ALL_PAIRS if pair not in TRANSITIONS]
ALLOWED = sorted(TRANSITIONS)


def test_table_is_what_design_says() -> None:
    assert set(TRANSITIONS) == {
        (S.NEW, S.RESERVED),
        (S.FAILED, S.RESERVED),
        (S.COMMITTED, S.RESERVED),
        (S.RESERVED, S.EXECUTING),
        (S.EXECUTING, S.COMMITTED),
        (S.EXECUTING, S.FAILED),
        (S.RESERVED, S.FAILED),
        (S.RESERVED, S.AMBIGUOUS),
        (S.EXECUTING, S.AMBIGUOUS),
        (S.AMBIGUOUS, S.COMMITTED),
        (S.AMBIGUOUS, S.FAILED),
    }
    # Nothing ever goes back to NEW (a deletion), and AMBIGUOUS only leaves by an answer.
    assert not any(new is S.NEW for _, new in TRANSITIONS)


@pytest.mark.parametrize(("old", "new"), FORBIDDEN, ids=[f"{a}->{b}" for a, b in FORBIDDEN])
def test_forbidden_transition_raises(old: EffectState, new: EffectState) -> None:
    with pytest.raises(InvalidArgument, match=f"{old.value} -> {new.value}"):
        check_transition(old, new)


@pytest.mark.parametrize(("old", "new"), ALLOWED, ids=[f"{a}->{b}" for a, b in ALLOWED])
def test_allowed_transition_passes(old: EffectState, new: EffectState) -> None:
    check_transition(old, new)


@pytest.mark.parametrize(("old", "new"), [(S.COMMITTED, S.FAILED), (S.AMBIGUOUS, S.RESERVED)])
def test_ledger_refuses_forbidden_transition(
    store: SQLiteStateStore, old: EffectState, new: EffectState
) -> None:
    with store.transaction() as conn, pytest.raises(InvalidArgument):
        L.move_effect(conn, "k", old=old, new=new, action_id="act_x", attempt=1, values={})


def record(
    state: EffectState,
    *,
    lease: timedelta | None = None,
    attempt: int = 1,
    committed_ago: timedelta | None = None,
) -> EffectRecord:
    return EffectRecord(
        effect_key="k",
        state=state,
        action_id="act_holder",
        attempt=attempt,
        lease_expires_at=None if lease is None else NOW + lease,
        created_at=NOW - timedelta(hours=1),
        updated_at=NOW - timedelta(minutes=1),
        committed_at=None if committed_ago is None else NOW - committed_ago,
    )


LIVE, EXPIRED = timedelta(seconds=30), timedelta(seconds=-1)
WINDOW = timedelta(minutes=10)

# (id, record, window, expected plan)
PLANS: list[tuple[str, EffectRecord | None, timedelta | None, Reserve | Refuse]] = [
    ("none", None, None, Reserve(1, S.NEW)),
    ("failed_renews", record(S.FAILED, attempt=3), None, Reserve(4, S.FAILED)),
    ("committed", record(S.COMMITTED), None, Refuse("committed", "act_holder")),
    (
        "committed_in_window",
        record(S.COMMITTED, committed_ago=timedelta(minutes=9)),
        WINDOW,
        Refuse("committed", "act_holder"),
    ),
    (
        "committed_window_passed",
        record(S.COMMITTED, committed_ago=WINDOW, attempt=2),
        WINDOW,
        Reserve(3, S.COMMITTED),
    ),
    ("ambiguous", record(S.AMBIGUOUS), None, Refuse("ambiguous", "act_holder")),
    ("ambiguous_window", record(S.AMBIGUOUS), WINDOW, Refuse("ambiguous", "act_holder")),
    ("reserved_live", record(S.RESERVED, lease=LIVE), None, Refuse("in_progress", "act_holder")),
    ("executing_live", record(S.EXECUTING, lease=LIVE), None, Refuse("in_progress", "act_holder")),
    (
        "executing_lease_ends_now",
        record(S.EXECUTING, lease=timedelta(0)),
        None,
        Refuse("in_progress", "act_holder"),
    ),
    (
        "reserved_expired",
        record(S.RESERVED, lease=EXPIRED),
        None,
        Refuse("ambiguous", "act_holder", ambiguate=True),
    ),
    (
        "executing_expired",
        record(S.EXECUTING, lease=EXPIRED),
        None,
        Refuse("ambiguous", "act_holder", ambiguate=True),
    ),
    (
        "executing_no_lease",
        record(S.EXECUTING),
        None,
        Refuse("ambiguous", "act_holder", ambiguate=True),
    ),
]


@pytest.mark.parametrize(
    ("rec", "window", "expected"), [p[1:] for p in PLANS], ids=[p[0] for p in PLANS]
)
def test_plan_reservation(
    rec: EffectRecord | None, window: timedelta | None, expected: Reserve | Refuse
) -> None:
    assert plan_reservation(rec, NOW, window) == expected


@pytest.mark.parametrize(
    ("state", "lease", "live"),
    [
        (S.RESERVED, LIVE, True),
        (S.EXECUTING, timedelta(0), True),
        (S.EXECUTING, EXPIRED, False),
        (S.EXECUTING, None, False),
        (S.COMMITTED, LIVE, False),
        (S.AMBIGUOUS, LIVE, False),
    ],
)
def test_lease_is_live(state: EffectState, lease: timedelta | None, live: bool) -> None:
    assert record(state, lease=lease).lease_is_live(NOW) is live


def test_lease_expired_record_becomes_ambiguous(
    make_control: Callable[..., Control], store: SQLiteStateStore, clock: Clock
) -> None:
    """A holder that never finishes: in-progress while its lease lives, ambiguous after."""
    control = make_control(lease=timedelta(seconds=30))
    me = Principal("bot")
    holder = control.begin(Action("refund", {"payment_id": "p1", "amount": 5}, me), "refund:p1")
    assert holder.held and holder.attempt == 1

    clock.advance(seconds=29)
    with pytest.raises(DuplicateEffect) as dup:
        control.begin(Action("refund", {"payment_id": "p1", "amount": 5}, me), "refund:p1")
    assert dup.value.state == "in_progress"

    clock.advance(seconds=2)
    with pytest.raises(AmbiguousEffect) as amb:
        control.begin(Action("refund", {"payment_id": "p1", "amount": 5}, me), "refund:p1")
    assert amb.value.effect_key == "refund:p1"
    assert amb.value.action_id == holder.action.action_id
    with store.reading() as conn:
        rec = L.get_effect(conn, "refund:p1")
    assert rec is not None and rec.state is S.AMBIGUOUS and rec.lease_expires_at is None

    # The late holder's outcome cannot be written over the ambiguous record.
    receipt = control.finish(holder, "committed")
    assert receipt.result == "ambiguous"
    with store.reading() as conn:
        rec = L.get_effect(conn, "refund:p1")
    assert rec is not None and rec.state is S.AMBIGUOUS
    types = [t for t, _ in events(store, "refund:p1")]
    assert types.count("EXECUTION_AMBIGUOUS") == 2
    assert "EXECUTION_COMMITTED" not in types
