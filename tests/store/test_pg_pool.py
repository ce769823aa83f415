"""PostgreSQL without a ping per checkout: a connection the server killed is still never
used for a decision, and a transaction that found its connection dead before COMMIT runs
again on a new one (it wrote nothing)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Connection, text

from ctrlrun import Control, Policy, context, protect
from ctrlrun.store import PostgresStateStore, open_store

from .conftest import PG_ADMIN, WRITE_POLICY


@pytest.fixture
def store(pg_database: str) -> Iterator[PostgresStateStore]:
    s = open_store(pg_database)
    assert isinstance(s, PostgresStateStore)
    try:
        yield s
    finally:
        s.close()


def _pings(store: PostgresStateStore) -> list[int]:
    seen: list[int] = []
    dialect: Any = store.engine.dialect
    ping = dialect.do_ping

    def counting(dbapi: Any) -> bool:
        seen.append(1)
        return bool(ping(dbapi))

    dialect.do_ping = counting
    return seen


def _kill_sessions(database: str, *, only: int | None = None) -> int:
    name = database.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        pids = [
            r[0]
            for r in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            if only is None or r[0] == only
        ]
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))  # waits for the exit
    return len(pids)


def test_no_ping_for_connections_in_use_a_ping_after_idling(store: PostgresStateStore) -> None:
    pings = _pings(store)
    for _ in range(20):
        with store.transaction() as conn:
            conn.execute(text("SELECT 1"))
    assert pings == []  # twenty transactions, no round trip spent on a ping
    time.sleep(1.3)
    with store.transaction() as conn:
        conn.execute(text("SELECT 1"))
    assert len(pings) == 1  # idle past a second: asked once


def test_every_call_goes_through_after_the_server_killed_the_pool(
    store: PostgresStateStore, pg_database: str
) -> None:
    control = Control(Policy.from_yaml(WRITE_POLICY), store)
    write = protect("bench.write", effect="w:{n}", control=control)(lambda n: n)
    outcomes = []
    with context(agent="bench"):
        for n in range(8):
            assert write(n) == n  # the pool holds live connections
        for round_ in range(5):
            assert _kill_sessions(pg_database) >= 1
            for n in range(3):
                try:
                    write(100 * (round_ + 1) + n)
                    outcomes.append("ok")
                except Exception as exc:  # what the caller would see is the test
                    outcomes.append(f"{type(exc).__name__}: {exc}")
    assert outcomes == ["ok"] * 15, outcomes


def test_a_connection_lost_before_commit_runs_the_transaction_again(
    store: PostgresStateStore, pg_database: str
) -> None:
    with store.transaction() as conn:
        conn.exec_driver_sql("CREATE TABLE t (n int)")
    runs: list[int] = []

    def body(conn: Connection) -> int:
        runs.append(1)
        pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
        conn.execute(text("INSERT INTO t VALUES (1)"))
        if len(runs) == 1:
            _kill_sessions(pg_database, only=pid)  # the server drops it before our COMMIT
        conn.execute(text("INSERT INTO t VALUES (2)"))
        return pid

    store.write(body)
    assert len(runs) == 2
    with store.reading() as conn:
        assert [r[0] for r in conn.execute(text("SELECT n FROM t ORDER BY n"))] == [1, 2]


def test_a_failure_that_is_not_a_lost_connection_is_not_retried(
    store: PostgresStateStore,
) -> None:
    runs: list[int] = []

    def body(conn: Connection) -> None:
        runs.append(1)
        conn.execute(text("SELECT * FROM no_such_table"))

    with pytest.raises(Exception, match="no_such_table"):
        store.write(body)
    assert len(runs) == 1


def test_a_connection_left_in_autocommit_is_never_handed_out(store: PostgresStateStore) -> None:
    with store.transaction() as conn:
        raw: Any = conn.connection.dbapi_connection
        conn.execute(text("SELECT 1"))
    raw.autocommit = True  # as a reservation run on its own, cut short, would leave it
    with store.transaction() as conn:
        fresh: Any = conn.connection.dbapi_connection
        conn.execute(text("CREATE TABLE t (x int)"))
        conn.execute(text("INSERT INTO t VALUES (1)"))
        conn.rollback()
        assert fresh is not raw and not fresh.autocommit
    with store.reading() as conn:  # the rollback undid both: they were one transaction
        assert conn.execute(text("SELECT to_regclass('t')")).scalar() is None
