"""The effect state machine: the transition table, plan_reservation, lease expiry.

The expectations here are literals written from DESIGN.md, never derived from the table under
test: a change to ``TRANSITIONS`` must be matched by a change here.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sdk_support import Clock, events, monotonic_follows

from ctrlrun import (
    Action,
    AmbiguousEffect,
    Control,
    DuplicateEffect,
    EffectState,
    InvalidArgument,
    NotExecuted,
    Principal,
    SQLiteStateStore,
)
from ctrlrun import ledger as L
from ctrlrun.states import (
    EffectRecord,
    Refuse,
    Reserve,
    check_transition,
    plan_reservation,
)

S = EffectState
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

# What DESIGN.md allows, written out by hand (x: allowed), not read from the table under test.
# A key is taken and started in one write; an outcome is recorded from EXECUTING only; only an
# answer (human or reconcile) moves AMBIGUOUS; nothing ever returns to NEW or is RESERVED.
EXPECTED = """
              new  reserved  executing  committed  failed  ambiguous
new            .      .          x          .        .         .
reserved       .      .          .          .        .         .
executing      .      .          .          x        x         x
committed      .      .          x          .        .         .
failed         .      .          x          .        .         .
ambiguous      .      .          .          x        x         .
"""


def expected_pairs() -> dict[tuple[str, str], bool]:
    header, *rows = EXPECTED.strip().splitlines()
    columns = header.split()
    pairs: dict[tuple[str, str], bool] = {}
    for row in rows:
        old, *marks = row.split()
        assert len(marks) == len(columns)
        for new, mark in zip(columns, marks, strict=True):
            pairs[(old, new)] = mark == "x"
    return pairs


PAIRS = expected_pairs()
ALLOWED = sorted(pair for pair, ok in PAIRS.items() if ok)
FORBIDDEN = sorted(pair for pair, ok in PAIRS.items() if not ok)


def test_the_expectation_covers_every_pair() -> None:
    assert len(PAIRS) == 36 and len(ALLOWED) == 8
    assert {old for old, _ in PAIRS} == {s.value for s in S}


@pytest.mark.parametrize(("old", "new"), FORBIDDEN, ids=[f"{a}->{b}" for a, b in FORBIDDEN])
def test_forbidden_transition_raises(old: str, new: str) -> None:
    with pytest.raises(InvalidArgument, match=f"{old} -> {new}"):
        check_transition(S(old), S(new))


@pytest.mark.parametrize(("old", "new"), ALLOWED, ids=[f"{a}->{b}" for a, b in ALLOWED])
def test_allowed_transition_passes(old: str, new: str) -> None:
    check_transition(S(old), S(new))


@pytest.mark.parametrize(("old", "new"), [(S.COMMITTED, S.FAILED), (S.AMBIGUOUS, S.EXECUTING)])
def test_ledger_refuses_forbidden_transition(
    store: SQLiteStateStore, old: EffectState, new: EffectState
) -> None:
    with store.transaction() as conn, pytest.raises(InvalidArgument):
        L.move_effect(conn, "k", old=old, new=new, action_id="act_x", attempt=1, values={})


def test_ledger_refuses_to_insert_anything_but_an_executing_record(
    store: SQLiteStateStore,
) -> None:
    values = {"effect_key": "k", "state": "committed", "action_id": "act_x", "attempt": 1}
    with store.transaction() as conn, pytest.raises(InvalidArgument, match="new -> committed"):
        L.insert_effect(conn, {**values, "created_at": "x", "updated_at": "x"})


def test_every_write_the_ledger_makes_is_in_the_table(
    make_control: Callable[..., Control],
    store: SQLiteStateStore,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Drive every path that moves a record and watch which transitions the ledger writes."""
    seen: set[tuple[str, str]] = set()
    real = L.check_transition

    def watch(old: EffectState, new: EffectState) -> None:
        real(old, new)
        seen.add((old.value, new.value))

    monkeypatch.setattr(L, "check_transition", watch)
    monotonic_follows(clock, monkeypatch)  # the window passes in elapsed time too
    control = make_control(lease=timedelta(seconds=30))
    me = Principal("bot")

    def act(**args: Any) -> Action:
        return Action("scale", {"cluster": "c", "deployment": "d", "replicas": 1, **args}, me)

    def refuse() -> None:
        raise NotExecuted("refused")

    def lose() -> None:
        raise TimeoutError("lost")

    control.execute(act(), lambda: None, "k1")  # new -> executing -> committed
    clock.advance(minutes=11)
    control.execute(act(), lambda: None, "k1")  # committed -> executing (window passed)
    with pytest.raises(NotExecuted):
        control.execute(act(), refuse, "k2")  # executing -> failed
    control.execute(act(), lambda: None, "k2")  # failed -> executing
    with pytest.raises(TimeoutError):
        control.execute(act(), lose, "k3")  # executing -> ambiguous
    control.resolve("k3", "committed")  # ambiguous -> committed (human)
    with pytest.raises(TimeoutError):
        control.execute(
            act(), lose, "k4", reconcile=lambda k: "not_executed", reconcile_eagerly=True
        )
    control.begin(act(), "k5")
    clock.advance(seconds=31)
    assert control.reconciler.expire_leases() == ["k5"]  # executing -> ambiguous (lease)
    assert seen == set(ALLOWED)


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
    make_control: Callable[..., Control],
    store: SQLiteStateStore,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A holder that never finishes: in-progress while its lease lives, ambiguous after."""
    monotonic_follows(clock, monkeypatch)  # seen live, the lease then runs out in real time
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
