"""Attacks on the SDK's clocks: a policy ``window:`` under wall-clock steps (SQLite and
PostgreSQL, across a process restart and a reboot), PostgreSQL's settle-window notes, a lease
left by an older writer, and effect keys spelt several ways."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from ctrlrun import (
    Action,
    AmbiguousEffect,
    Control,
    DuplicateEffect,
    EffectKeyError,
    InvalidArgument,
    Policy,
    Principal,
    SQLiteStateStore,
    clocks,
    context,
    holder,
    protect,
    steady,
)
from ctrlrun import ledger as L
from ctrlrun.states import EffectState
from ctrlrun.store import StateStore, open_store

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  scale:
    effect: "scale:{deployment}:{replicas}"
    window: 10m
    decision: allow
"""
KEY = "scale:checkout:6"
WINDOW = 600.0
BOT = Principal("bot")


def scale() -> Action:
    return Action("scale", {"deployment": "checkout", "replicas": 6}, BOT)


class Wall:
    """The ledger's clock, stepped by hand: ``step`` seconds ahead of (or behind) the truth."""

    def __init__(self, store: StateStore) -> None:
        self.store, self.step = store, 0.0

    def __call__(self) -> datetime:
        return self.store.clock() + timedelta(seconds=self.step)


def elapse(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """``seconds`` of real time pass on the monotonic clock (the wall is stepped apart)."""
    monkeypatch.setattr(steady, "monotonic", lambda: time.monotonic() + seconds)


@pytest.fixture(params=["sqlite", "postgresql"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateStore]:
    if request.param == "sqlite":
        store: StateStore = SQLiteStateStore(tmp_path / "state.db")
    else:
        store = open_store(request.getfixturevalue("pg_url"))
    yield store
    store.close()


def record(store: StateStore) -> Any:
    with store.reading() as conn:
        return L.get_effect(conn, KEY)


def runs(control: Control, ran: list[int], n: int) -> bool:
    """Whether the scale runs now (True) or is refused as committed (False)."""
    try:
        control.execute(scale(), lambda: ran.append(n), KEY)
    except DuplicateEffect as exc:
        assert exc.state == "committed"
        return False
    return True


# -- 1. a window holds for its length of elapsed time ----------------------------------------


def test_a_forward_step_of_the_ledgers_clock_does_not_reopen_a_window(
    any_store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    wall = Wall(any_store)
    control = Control(Policy.from_yaml(POLICY), any_store, clock=wall)
    ran: list[int] = []
    assert runs(control, ran, 1)
    rec = record(any_store)
    assert rec.committed_on == holder.clock() and rec.committed_steady is not None
    for step in (8.0, WINDOW + 8, 86_400.0):  # NTP, an operator, a clock a day ahead
        wall.step = step
        assert not runs(control, ran, 99)
    elapse(monkeypatch, WINDOW - 1)
    assert not runs(control, ran, 99)  # the wall says long past, time says not yet
    elapse(monkeypatch, WINDOW)
    assert runs(control, ran, 2)
    assert ran == [1, 2] and record(any_store).attempt == 2


def test_a_backward_step_keeps_a_window_shut_until_both_clocks_pass_and_loses_nothing(
    any_store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    wall = Wall(any_store)
    control = Control(Policy.from_yaml(POLICY), any_store, clock=wall)
    ran: list[int] = []
    assert runs(control, ran, 1)
    wall.step = -3600.0  # set back an hour
    elapse(monkeypatch, WINDOW)
    assert not runs(control, ran, 99)  # time has passed, but never opens on one clock
    wall.step = -3600.0 + WINDOW + 3600  # the wall catches up
    assert runs(control, ran, 2)
    with any_store.reading() as conn:
        n = conn.execute(text("SELECT count(*) FROM receipts")).scalar_one()
    assert n == 3 and ran == [1, 2]  # committed, blocked, committed: every receipt kept


_WORKER = """
import sys
from ctrlrun import Action, Control, Policy, Principal, SQLiteStateStore
store = SQLiteStateStore(sys.argv[1])
control = Control(Policy.from_yaml(sys.argv[2]), store)
control.execute(Action("scale", {"deployment": "checkout", "replicas": 6}, Principal("bot")),
                lambda: None, "scale:checkout:6")
store.close()
"""


def test_a_window_committed_by_a_process_that_exited_holds_in_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "state.db"
    SQLiteStateStore(db).close()
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, str(db), POLICY], capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()
    monkeypatch.setattr(clocks, "_offset", lambda: timedelta(seconds=WINDOW + 8))
    store = SQLiteStateStore(db)  # a restart: another process, the same boot
    try:
        control = Control(Policy.from_yaml(POLICY), store)
        ran: list[int] = []
        assert not runs(control, ran, 99)
        elapse(monkeypatch, WINDOW)
        assert runs(control, ran, 2) and ran == [2]
    finally:
        store.close()


@pytest.mark.parametrize("committed_on", ["another-boot " + "x" * 8, None])
def test_a_commit_from_another_boot_or_an_older_writer_waits_for_the_window_since_boot(
    any_store: StateStore, monkeypatch: pytest.MonkeyPatch, committed_on: str | None
) -> None:
    """A host that booted with its clock a day ahead: the commit made before the reboot (or by
    an older sidecar, which writes no reading) stays shut for a window after the boot."""
    wall = Wall(any_store)
    control = Control(Policy.from_yaml(POLICY), any_store, clock=wall)
    ran: list[int] = []
    assert runs(control, ran, 1)
    with any_store.transaction() as conn:
        conn.execute(
            text("UPDATE effects SET committed_on = :on, committed_steady = :s"),
            {"on": committed_on, "s": None if committed_on is None else 12.5},
        )
    wall.step = 86_400.0
    monkeypatch.setattr(steady, "monotonic", lambda: 30.0)  # booted 30 s ago
    assert not runs(control, ran, 99)
    monkeypatch.setattr(steady, "monotonic", lambda: WINDOW + 1)
    assert runs(control, ran, 2) and ran == [1, 2]


def test_a_resolution_to_committed_starts_the_window_on_both_clocks(
    any_store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    wall = Wall(any_store)
    control = Control(Policy.from_yaml(POLICY), any_store, clock=wall)

    def lost() -> None:
        raise TimeoutError("no answer")

    with pytest.raises(TimeoutError):
        control.execute(scale(), lost, KEY)
    control.resolve(KEY, "committed")
    rec = record(any_store)
    assert rec.state is EffectState.COMMITTED and rec.committed_on == holder.clock()
    wall.step = WINDOW + 8
    ran: list[int] = []
    assert not runs(control, ran, 99)
    elapse(monkeypatch, WINDOW)
    assert runs(control, ran, 2)


# -- 2. PostgreSQL notes what SQLite notes ----------------------------------------------------


def test_a_reservation_and_an_ambiguous_outcome_are_noted_on_the_monotonic_clock(
    any_store: StateStore,
) -> None:
    """On PostgreSQL too (pg_hot's one-trip writes): a settle window after either stamp is
    waited out here on the monotonic clock, whatever the ledger's clock says."""
    control = Control(Policy.from_yaml(POLICY), any_store)
    begun = Action("scale", {"deployment": "begun", "replicas": 1}, BOT)
    control.begin(begun, "scale:begun:1")
    started = L.parse_iso(row_of(any_store, "scale:begun:1")["attempt_started_at"])
    assert steady.still_to_wait("scale:begun:1", 1, started + timedelta(seconds=60)) > 30

    def lost() -> None:
        raise TimeoutError("no answer")

    lost_one = Action("scale", {"deployment": "lost", "replicas": 1}, BOT)
    with pytest.raises(TimeoutError):
        control.execute(lost_one, lost, "scale:lost:1")
    row = row_of(any_store, "scale:lost:1")
    assert row["state"] == "ambiguous"
    until = L.parse_iso(row["updated_at"]) + timedelta(seconds=60)
    assert steady.still_to_wait("scale:lost:1", 1, until) > 30


def row_of(store: StateStore, key: str) -> Any:
    with store.reading() as conn:
        found = L.get_effect_row(conn, key)
    assert found is not None
    return found


# -- 3. a lease an older sidecar holds ------------------------------------------------------


def old_writers_lease(store: StateStore, control: Control, lease: float) -> None:
    """The key taken by a process on revision 0018: a lease naming no holder."""
    control.begin(scale(), KEY, lease=timedelta(seconds=lease))
    with store.transaction() as conn:
        conn.execute(text("UPDATE effects SET lease_holder = NULL, lease_steady_until = NULL"))


def outcome(control: Control) -> str:
    try:
        control.execute(scale(), lambda: None, KEY)
    except DuplicateEffect as exc:
        return exc.state
    except AmbiguousEffect:
        return "ambiguous"
    return "ran"


def test_an_older_writers_lease_seen_live_is_not_stolen_after_a_forward_step(
    any_store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    wall = Wall(any_store)
    control = Control(Policy.from_yaml(POLICY), any_store, clock=wall)
    old_writers_lease(any_store, control, 60)
    assert outcome(control) == "in_progress"  # seen live, 60 s left
    wall.step = 120.0  # NTP steps this host's (the ledger's) clock past the lease's end
    assert outcome(control) == "in_progress"
    assert control.reconciler.expire_leases() == []  # nor by the sweep
    assert record(any_store).state is EffectState.EXECUTING
    elapse(monkeypatch, 61)  # the lease really has run out: its holder may be dead
    assert outcome(control) == "ambiguous"


def test_a_lease_ambiguated_leaves_no_monotonic_end_for_an_older_writers_next_lease(
    any_store: StateStore,
) -> None:
    """An older sidecar's next lease on the key writes no holder columns: one left by the
    attempt that ran out would be taken for its own."""
    wall = Wall(any_store)
    control = Control(Policy.from_yaml(POLICY), any_store, clock=wall)
    control.begin(scale(), KEY, lease=timedelta(seconds=5))
    assert record(any_store).lease_steady_until is not None
    wall.step = 3600.0
    assert control.reconciler.expire_leases() == [KEY]
    rec = record(any_store)
    assert rec.state is EffectState.AMBIGUOUS and rec.lease_steady_until is None


# -- 4. one value, one spelling, one key ----------------------------------------------------

W_POLICY = "schema: ctrlrun.policy/v2\nactions:\n  w: {decision: allow}\n"


@pytest.mark.parametrize(
    ("value", "refused"),
    [
        ("1", None),  # the integer's own spelling: the same key, "w:1", a duplicate
        ("01", EffectKeyError),
        ("+1", EffectKeyError),
        ("1.0", EffectKeyError),
        ("1e0", EffectKeyError),
        ("1_0", EffectKeyError),
        ("0x1", EffectKeyError),
        ("\u0661", EffectKeyError),  # ARABIC-INDIC DIGIT ONE: int() and float() read 1
        ("-0", EffectKeyError),
        (" 1", EffectKeyError),
        (True, EffectKeyError),  # True == 1 to the function: a bool names no key
        (1.0, InvalidArgument),  # floats and Decimals are no arguments at all
        (Decimal("1"), InvalidArgument),
    ],
    ids=lambda v: repr(v),
)
def test_an_sdk_effect_key_has_one_spelling_per_value(
    tmp_path: Path, value: Any, refused: type[Exception] | None
) -> None:
    store = SQLiteStateStore(tmp_path / "state.db")
    ctl = Control(Policy.from_yaml(W_POLICY), store)
    ran: list[Any] = []

    @protect("w", effect="w:{n}", control=ctl)
    def write(n: Any) -> None:
        ran.append(int(n))  # as many functions do: every spelling above is 1 (or 10) here

    try:
        with context("bot"):
            write(1)
            if refused is None:
                with pytest.raises(DuplicateEffect):
                    write(value)
            else:
                with pytest.raises(refused) as caught:
                    write(value)
                assert "\n" not in str(caught.value)
        assert ran == [1]
    finally:
        store.close()


@pytest.mark.parametrize("value", ["007x", "pi_1", "1a", "inf", "nan", "-7", "0", "10"])
def test_values_that_are_not_respelt_numbers_pass(tmp_path: Path, value: str) -> None:
    store = SQLiteStateStore(tmp_path / "state.db")
    ctl = Control(Policy.from_yaml(W_POLICY), store)

    @protect("w", effect="w:{n}", control=ctl)
    def write(n: str) -> str:
        return n

    try:
        with context("bot"):
            assert write(value) == value
    finally:
        store.close()


# -- work handed back: any lazy iterator, not only map and filter ---------------------------


@pytest.mark.parametrize("kind", ["starmap", "zip-map", "enumerate-map", "islice-map", "chain"])
def test_a_function_returning_a_lazy_iterator_that_acts_later_is_refused(
    tmp_path: Path, kind: str
) -> None:
    """``return itertools.starmap(api.refund, args)`` (or a zip over a map): the refund runs
    when the caller iterates, after the record said committed. Refused, the call ambiguous."""
    store = SQLiteStateStore(tmp_path / "state.db")
    ctl = Control(Policy.from_yaml(W_POLICY), store)
    ran: list[int] = []

    def act(n: int) -> int:
        ran.append(n)
        return n

    lazy: dict[str, Callable[[], Any]] = {
        "starmap": lambda: itertools.starmap(act, [(1,)]),
        "zip-map": lambda: zip(map(act, [1]), "a", strict=False),
        "enumerate-map": lambda: enumerate(map(act, [1])),
        "islice-map": lambda: itertools.islice(map(act, [1]), 1),
        "chain": lambda: itertools.chain(map(act, [1])),
    }

    @protect("w", effect="w:{n}", control=ctl)
    def write(n: int) -> Any:
        return lazy[kind]()

    try:
        with context("bot"), pytest.raises(InvalidArgument, match="after the call is recorded"):
            write(1)
        assert ran == []
        assert row_of(store, "w:1")["state"] == "ambiguous"
    finally:
        store.close()


def test_a_function_may_still_return_data_and_files(tmp_path: Path) -> None:
    store = SQLiteStateStore(tmp_path / "state.db")
    ctl = Control(Policy.from_yaml(W_POLICY), store)
    path = tmp_path / "out.txt"
    path.write_text("done\n")

    @protect("w", effect="w:{n}", control=ctl)
    def write(n: int) -> Any:
        return [n] if n == 1 else path.open(encoding="utf-8")

    try:
        with context("bot"):
            assert write(1) == [1]
            with write(2) as f:
                assert f.read() == "done\n"
    finally:
        store.close()


def test_a_respelt_number_through_the_resource_is_refused_too(tmp_path: Path) -> None:
    """``effect: "refund:{resource}"`` over ``resource: "order:{order_id}"``: "007" reaches
    the key through the resource."""
    policy = (
        "schema: ctrlrun.policy/v2\nactions:\n  refund:\n    decision: allow\n"
        '    resource: "order:{order_id}"\n    effect: "refund:{resource}"\n'
    )
    store = SQLiteStateStore(tmp_path / "state.db")
    ctl = Control(Policy.from_yaml(policy), store)
    ran: list[int] = []

    @protect("refund", control=ctl)
    def refund(order_id: Any) -> None:
        ran.append(int(order_id))

    try:
        with context("bot"):
            refund(7)
            with pytest.raises(EffectKeyError, match="order_id"):
                refund("007")
            with pytest.raises(DuplicateEffect):
                refund("7")
        assert ran == [7]
    finally:
        store.close()
