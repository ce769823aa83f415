"""Group commit on a real SQLite file: who shares a COMMIT, and what a failure undoes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, event, text

from ctrlrun.errors import StoreError
from ctrlrun.group_commit import GroupCommit
from ctrlrun.store import SQLiteStateStore

WAIT = 10.0  # seconds any step of these tests may take at most


def _begin(conn: Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def _rows(engine: Engine, table: str) -> list[int]:
    with engine.connect() as conn:
        return [int(r[0]) for r in conn.execute(text(f"SELECT id FROM {table} ORDER BY id"))]


class Group:
    """A held first body, callers queued behind it, then everything let go."""

    def __init__(self, gc: GroupCommit) -> None:
        self.gc = gc
        self.held = threading.Event()
        self.go = threading.Event()
        self.results: dict[str, object] = {}
        self.threads: list[threading.Thread] = []
        self.commits: list[int] = []

    def call(self, name: str, body: Any) -> None:
        def run() -> None:
            try:
                with self.gc.transaction() as conn:
                    body(conn)
                self.results[name] = "ok"
            except BaseException as exc:  # what each caller saw is the test
                self.results[name] = exc

        t = threading.Thread(target=run)
        t.start()
        self.threads.append(t)

    def first(self, body: Any) -> None:
        def held(conn: Connection) -> None:
            body(conn)
            self.held.set()
            assert self.go.wait(WAIT)

        self.call("first", held)
        assert self.held.wait(WAIT)

    def queue(self, n: int) -> None:
        deadline = time.monotonic() + WAIT
        while self.gc._queued < n:  # the callers are waiting for the body that is held
            assert time.monotonic() < deadline
            time.sleep(0.005)

    def release(self) -> None:
        self.go.set()
        for t in self.threads:
            t.join(WAIT)
            assert not t.is_alive()


def _insert(table: str, id: int, parent: int | None = None) -> Any:
    def body(conn: Connection) -> None:
        if table == "parent":
            conn.execute(text("INSERT INTO parent VALUES (:i)"), {"i": id})
        else:
            conn.execute(text("INSERT INTO child VALUES (:i, :p)"), {"i": id, "p": parent})

    return body


def _counting(engine: Engine) -> list[int]:
    commits: list[int] = []
    event.listen(engine, "commit", lambda conn: commits.append(1))
    return commits


def test_callers_queued_behind_a_body_share_its_commit(engine: Engine) -> None:
    commits = _counting(engine)
    g = Group(GroupCommit(engine.connect, _begin))
    g.first(_insert("parent", 1))
    for i in (2, 3, 4):
        g.call(f"p{i}", _insert("parent", i))
    g.queue(3)
    assert _rows(engine, "parent") == []  # nothing is visible before its COMMIT
    g.release()
    assert set(g.results.values()) == {"ok"}
    assert _rows(engine, "parent") == [1, 2, 3, 4]
    assert len(commits) == 1


def test_a_failing_body_is_undone_alone_while_the_others_commit(engine: Engine) -> None:
    def fails(conn: Connection) -> None:
        _insert("parent", 3)(conn)
        raise ValueError("refused")

    g = Group(GroupCommit(engine.connect, _begin))
    g.first(_insert("parent", 1))
    g.call("bad", fails)
    g.queue(1)
    g.call("p2", _insert("parent", 2))
    g.queue(2)
    g.release()
    assert isinstance(g.results["bad"], ValueError)
    assert g.results["first"] == g.results["p2"] == "ok"
    assert _rows(engine, "parent") == [1, 2]


def test_a_failing_first_body_leaves_nothing_and_the_next_caller_starts_afresh(
    engine: Engine,
) -> None:
    gc = GroupCommit(engine.connect, _begin)
    with pytest.raises(ValueError), gc.transaction() as conn:
        _insert("parent", 1)(conn)
        raise ValueError("refused")
    with gc.transaction() as conn:
        _insert("parent", 2)(conn)
    assert _rows(engine, "parent") == [2]


def test_a_failed_commit_fails_every_caller_of_its_group_and_keeps_nothing(
    engine: Engine,
) -> None:
    # The last body's row breaks a deferred constraint: the group's COMMIT itself fails.
    g = Group(GroupCommit(engine.connect, _begin))
    g.first(_insert("parent", 1))
    g.call("p2", _insert("parent", 2))
    g.queue(1)
    g.call("orphan", _insert("child", 1, parent=99))
    g.queue(2)
    g.release()
    assert all(isinstance(r, Exception) for r in g.results.values()), g.results
    assert _rows(engine, "parent") == [] and _rows(engine, "child") == []


def test_a_transaction_inside_another_is_refused_not_deadlocked(engine: Engine) -> None:
    gc = GroupCommit(engine.connect, _begin)
    with gc.transaction(), pytest.raises(StoreError, match="inside another"):  # noqa: SIM117
        with gc.transaction():
            pass


def test_the_ledger_commits_concurrent_decisions_together(tmp_path: Path) -> None:
    # The SQLite ledger uses it: eight threads' transactions, fewer COMMITs than callers.
    store = SQLiteStateStore(tmp_path / "state.db")
    commits = _counting(store.engine)
    start = threading.Barrier(8)

    def work() -> None:
        start.wait(WAIT)
        for _ in range(20):
            with store.transaction() as conn:
                conn.execute(text("SELECT count(*) FROM effects")).scalar()
                time.sleep(0.001)  # a body long enough for others to queue behind it

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    store.close()
    assert 0 < len(commits) < 160


def test_a_connection_broken_mid_group_fails_its_group_and_the_next_starts_afresh(
    engine: Engine,
) -> None:
    def breaks(conn: Connection) -> None:
        _insert("parent", 2)(conn)
        conn.connection.dbapi_connection.close()  # type: ignore[union-attr]
        raise ValueError("the connection broke")

    gc = GroupCommit(engine.connect, _begin)
    g = Group(gc)
    g.first(_insert("parent", 1))
    g.call("broken", breaks)
    g.queue(1)
    g.release()
    assert isinstance(g.results["first"], Exception)  # its body was in the broken group
    assert isinstance(g.results["broken"], Exception)
    with gc.transaction() as conn:  # a new group, on a new connection
        _insert("parent", 3)(conn)
    assert _rows(engine, "parent") == [3]
