"""Batches of decisions on a real SQLite file: run on the caller's thread only when nothing has
to wait, one COMMIT for the batch, every result handed back only after it, and a failure
undoing exactly what it must (``GroupCommit.run_here``, ``submit``, ``decisions.decide``)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, event, text

from ctrlrun import Action, Control, Policy, Principal
from ctrlrun.batch_job import Job
from ctrlrun.decisions import decide
from ctrlrun.errors import StoreError
from ctrlrun.group_commit import GroupCommit
from ctrlrun.store import SQLiteStateStore

WAIT = 10.0

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  pay:
    decision: allow
    effect: "pay:{n}"
"""


def _begin(conn: Connection) -> None:
    conn.connection.dbapi_connection.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]


def _rows(engine: Engine, table: str) -> list[int]:
    with engine.connect() as conn:
        return [int(r[0]) for r in conn.execute(text(f"SELECT id FROM {table} ORDER BY id"))]


class Results:
    """Jobs that insert rows through ``gc.transaction()``, and what each caller was told."""

    def __init__(self, gc: GroupCommit) -> None:
        self.gc = gc
        self.told: dict[str, Any] = {}
        self.answered = threading.Event()
        self.expected = 0

    def job(self, name: str, table: str, id: int, parent: int | None = None) -> Job:
        def body() -> str:
            with self.gc.transaction() as conn:
                if table == "parent":
                    conn.execute(text("INSERT INTO parent VALUES (:i)"), {"i": id})
                elif table == "child":
                    conn.execute(text("INSERT INTO child VALUES (:i, :p)"), {"i": id, "p": parent})
                else:
                    conn.execute(text("INSERT INTO parent VALUES (:i)"), {"i": id})
                    raise ValueError("refused")
            return name

        self.expected += 1
        return Job(body, (), lambda result, error: self._tell(name, result, error))

    def _tell(self, name: str, result: Any, error: BaseException | None) -> None:
        self.told[name] = result if error is None else error
        if len(self.told) == self.expected:
            self.answered.set()


def _warm(gc: GroupCommit) -> None:
    with gc.transaction() as conn:  # a connection kept from before: run_here needs one
        conn.exec_driver_sql("SELECT 1")


def _decide(gc: GroupCommit, batch: list[Job], where: str, r: Results) -> None:
    """Run ``batch`` as one batch, ``here`` or on the decision thread, and wait for it."""
    if where == "here":
        assert gc.run_here(batch)
    else:
        _submit_together(gc, batch)
        assert r.answered.wait(WAIT)


def _submit_together(gc: GroupCommit, batch: list[Job]) -> None:
    """Submit ``batch`` while a transaction holds the lock: the decision thread, waiting for
    it, takes every job queued meanwhile into one batch (and joins that transaction's group,
    whose fate the empty transaction shares)."""
    with contextlib.suppress(StoreError), gc.transaction():
        for job in batch:
            gc.submit(job)
        deadline = time.monotonic() + WAIT
        while gc._queued == 0:  # the decision thread waits for the lock, with the jobs queued
            assert time.monotonic() < deadline
            time.sleep(0.005)


def _commits(engine: Engine) -> list[int]:
    seen: list[int] = []
    event.listen(engine, "commit", lambda conn: seen.append(1))
    return seen


def test_a_batch_shares_one_commit_and_a_failing_decision_is_undone_alone(
    engine: Engine,
) -> None:
    gc = GroupCommit(engine.connect, _begin)
    _warm(gc)
    commits = _commits(engine)
    r = Results(gc)
    batch = [r.job("a", "parent", 1), r.job("b", "fails", 2), r.job("c", "parent", 3)]
    assert gc.run_here(batch)
    assert r.told["a"] == "a" and r.told["c"] == "c"
    assert isinstance(r.told["b"], ValueError)  # its savepoint rolled back, the others kept
    assert _rows(engine, "parent") == [1, 3]
    assert len(commits) == 1


def test_the_first_decision_of_a_batch_failing_keeps_the_rest(engine: Engine) -> None:
    gc = GroupCommit(engine.connect, _begin)
    _warm(gc)
    r = Results(gc)
    assert gc.run_here([r.job("a", "fails", 1), r.job("b", "parent", 2)])
    assert isinstance(r.told["a"], ValueError) and r.told["b"] == "b"
    assert _rows(engine, "parent") == [2]


@pytest.mark.parametrize("where", ["here", "decision thread"])
def test_a_failed_batch_commit_fails_every_decision_in_it_and_keeps_nothing(
    engine: Engine, where: str
) -> None:
    gc = GroupCommit(engine.connect, _begin)
    _warm(gc)
    r = Results(gc)
    # The last job's row breaks a deferred constraint: the batch's COMMIT itself fails.
    batch = [r.job("a", "parent", 1), r.job("b", "parent", 2), r.job("c", "child", 1, 99)]
    _decide(gc, batch, where, r)
    assert set(r.told) == {"a", "b", "c"}
    assert all(isinstance(e, StoreError) for e in r.told.values()), r.told
    assert _rows(engine, "parent") == [] and _rows(engine, "child") == []
    # The connection was thrown away: the next batch is not run here (opening one may
    # wait), and the decision thread runs it on a new connection.
    r2 = Results(gc)
    nxt = [r2.job("d", "parent", 4)]
    assert not gc.run_here(nxt) and r2.told == {}
    gc.submit(nxt[0])
    assert r2.answered.wait(WAIT) and r2.told == {"d": "d"}
    assert _rows(engine, "parent") == [4]
    gc.close()


@pytest.mark.parametrize("where", ["here", "decision thread"])
def test_each_decision_is_told_its_result_only_after_the_batch_commit(
    engine: Engine, where: str
) -> None:
    gc = GroupCommit(engine.connect, _begin)
    _warm(gc)
    r = Results(gc)
    visible: dict[str, list[int]] = {}
    tell = r._tell

    def seen(name: str, result: Any, error: BaseException | None) -> None:
        visible[name] = _rows(engine, "parent")  # read on another connection, when told
        tell(name, result, error)

    r._tell = seen  # type: ignore[method-assign]
    batch = [r.job(str(n), "parent", n) for n in range(1, 5)]
    _decide(gc, batch, where, r)
    assert visible == {str(n): [1, 2, 3, 4] for n in range(1, 5)}
    gc.close()


def test_nothing_runs_here_while_another_connection_holds_the_write_lock(
    engine: Engine, tmp_path: Path
) -> None:
    gc = GroupCommit(engine.connect, _begin)
    _warm(gc)
    other = sqlite3.connect(tmp_path / "g.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    r = Results(gc)
    batch = [r.job("a", "parent", 1)]
    started = time.monotonic()
    assert not gc.run_here(batch)  # SQLITE_BUSY at once, not after the 5 s busy timeout
    assert time.monotonic() - started < 1.0
    assert r.told == {}  # nothing ran
    for job in batch:
        gc.submit(job)  # the decision thread waits for the lock instead
    time.sleep(0.2)
    assert r.told == {}
    other.execute("COMMIT")
    other.close()
    assert r.answered.wait(WAIT)
    assert r.told == {"a": "a"} and _rows(engine, "parent") == [1]
    gc.close()


def test_nothing_runs_here_while_another_thread_is_in_a_transaction(engine: Engine) -> None:
    gc = GroupCommit(engine.connect, _begin)
    _warm(gc)
    inside, go = threading.Event(), threading.Event()

    def hold() -> None:
        with gc.transaction():
            inside.set()
            go.wait(WAIT)

    t = threading.Thread(target=hold)
    t.start()
    assert inside.wait(WAIT)
    r = Results(gc)
    assert not gc.run_here([r.job("a", "parent", 1)])
    go.set()
    t.join(WAIT)
    assert r.told == {}


def test_without_a_kept_connection_nothing_runs_here(engine: Engine) -> None:
    gc = GroupCommit(engine.connect, _begin)
    r = Results(gc)
    assert not gc.run_here([r.job("a", "parent", 1)])  # opening one may wait: not here


# -- through the kernel, on an event loop ------------------------------------------------------


def _control(tmp_path: Path) -> Control:
    return Control(Policy.from_yaml(POLICY), SQLiteStateStore(tmp_path / "state.db"))


def _action(ctl: Control, n: int) -> Action:
    return ctl.action("pay", {"n": n}, Principal("bench"))


def _state(path: Path, key: str) -> str | None:
    with sqlite3.connect(path) as raw:
        row = raw.execute("SELECT state FROM effects WHERE effect_key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def test_the_loop_keeps_running_while_the_ledger_is_locked_elsewhere(tmp_path: Path) -> None:
    ctl = _control(tmp_path)
    ctl.store.write(lambda conn: None)
    other = sqlite3.connect(tmp_path / "state.db", isolation_level=None)

    async def main() -> tuple[int, str]:
        other.execute("BEGIN IMMEDIATE")  # another process's writer, or a checkpoint
        ticks = 0
        decision = asyncio.ensure_future(decide(ctl.store, ctl.begin, _action(ctl, 1), "pay:1"))
        for _ in range(20):  # the loop is not blocked: it ticks every 10 ms meanwhile
            await asyncio.sleep(0.01)
            ticks += 1
        assert not decision.done()
        other.execute("COMMIT")
        attempt = await asyncio.wait_for(decision, WAIT)
        return ticks, attempt.effect_key

    ticks, key = asyncio.run(main())
    other.close()
    assert ticks == 20 and key == "pay:1"
    assert _state(tmp_path / "state.db", "pay:1") == "executing"
    ctl.store.close()


def test_a_decision_is_answered_only_once_it_is_committed(tmp_path: Path) -> None:
    ctl = _control(tmp_path)
    ctl.store.write(lambda conn: None)
    seen: list[str | None] = []

    async def main() -> None:
        tasks = [decide(ctl.store, ctl.begin, _action(ctl, n), f"pay:{n}") for n in range(5)]
        for done in asyncio.as_completed(tasks):
            attempt = await done
            seen.append(_state(tmp_path / "state.db", attempt.effect_key))  # another connection

    asyncio.run(main())
    assert seen == ["executing"] * 5
    ctl.store.close()


def test_a_batch_whose_connection_breaks_refuses_its_begins_and_records_no_finish(
    tmp_path: Path,
) -> None:
    ctl = _control(tmp_path)
    ctl.store.write(lambda conn: None)
    path = tmp_path / "state.db"

    def breaks() -> None:
        with ctl.store.transaction() as conn:
            conn.connection.dbapi_connection.close()  # type: ignore[union-attr]

    async def main() -> list[Any]:
        first = await decide(ctl.store, ctl.begin, _action(ctl, 1), "pay:1")
        # One loop iteration: a finish, a begin, then a decision whose connection breaks.
        calls: list[Callable[[], Any]] = [
            lambda: decide(ctl.store, ctl.finish, first, "committed"),
            lambda: decide(ctl.store, ctl.begin, _action(ctl, 2), "pay:2"),
            lambda: decide(ctl.store, breaks),
        ]
        return await asyncio.gather(*(c() for c in calls), return_exceptions=True)

    told = asyncio.run(main())
    assert all(isinstance(t, Exception) for t in told), told
    assert _state(path, "pay:1") == "executing"  # its outcome unrecorded: under its lease
    assert _state(path, "pay:2") is None  # refused: nothing reserved, nothing forwarded
    # The next decision starts afresh.
    again = asyncio.run(decide(ctl.store, ctl.begin, _action(ctl, 3), "pay:3"))
    assert again.effect_key == "pay:3" and _state(path, "pay:3") == "executing"
    ctl.store.close()


def test_a_closed_loop_and_its_decisions_are_not_kept(tmp_path: Path) -> None:
    import gc
    import weakref

    from ctrlrun import decisions

    ctl = _control(tmp_path)
    ctl.store.write(lambda conn: None)
    gc.collect()
    before = len(decisions._wakers)  # other tests' loops may still be alive
    loop = asyncio.new_event_loop()
    loop.run_until_complete(decide(ctl.store, ctl.begin, _action(ctl, 1), "pay:1"))
    loop.close()
    gone = weakref.ref(loop)
    del loop
    gc.collect()
    assert gone() is None and len(decisions._wakers) <= before
    ctl.store.close()


def test_a_replaced_ledger_is_saved_aside_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Saving a lost ledger's copy reads the whole file: never on the loop, where every
    # request (reads too) would wait for it. The decision is refused all the same.
    from ctrlrun import identity

    ctl = _control(tmp_path)
    ctl.store.write(lambda conn: None)
    where: list[bool] = []
    real = identity.rescue

    def rescue(anchor: Any, path: Path) -> Path | None:
        where.append(threading.get_ident() == loop_thread)
        return real(anchor, path)

    monkeypatch.setattr(identity, "rescue", rescue)
    path = tmp_path / "state.db"
    path.rename(tmp_path / "moved.db")
    path.write_bytes(b"")  # another file under the ledger's name

    async def main() -> BaseException | None:
        try:
            await decide(ctl.store, ctl.begin, _action(ctl, 1), "pay:1")
        except BaseException as exc:
            return exc
        return None

    loop_thread = threading.get_ident()  # asyncio.run runs the loop on this thread
    refused = asyncio.run(main())
    assert isinstance(refused, StoreError), refused
    assert where == [False]
    ctl.store.close()
