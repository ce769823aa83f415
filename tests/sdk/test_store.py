"""Opening ledgers: SQLite settings, migrations under a lock, refusals, PostgreSQL."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from sdk_support import run_parallel
from sqlalchemy import text

from ctrlrun import InvalidArgument, SchemaMismatch, SQLiteStateStore
from ctrlrun import ledger as L
from ctrlrun.errors import StoreError
from ctrlrun.store import HEAD_REVISION, PostgresStateStore, open_store

TABLES = {"alembic_version", "approvals", "effects", "events", "receipt_chain", "receipts"}


def sqlite_tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


@pytest.mark.parametrize("path", ["", ":memory:", "file:x?mode=memory&cache=shared"])
def test_sqlite_refuses_memory(path: str) -> None:
    with pytest.raises(InvalidArgument):
        SQLiteStateStore(path)


def test_sqlite_settings_and_schema(store: SQLiteStateStore, db_path: Path) -> None:
    with store.reading() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 5000
        assert (
            conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == HEAD_REVISION
        )
        assert L.chain_head(conn) == (0, "sha256:" + "00" * 32)
    assert sqlite_tables(db_path) >= TABLES


def test_reopen_finds_schema_current(store: SQLiteStateStore, db_path: Path) -> None:
    again = SQLiteStateStore(db_path, create=False)
    again.ping()
    again.close()


def test_create_false_never_creates(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "state.db"
    with pytest.raises(StoreError, match="no ctrlrun ledger"):
        SQLiteStateStore(path, create=False)
    assert not path.parent.exists()


def test_create_false_on_empty_file_refuses(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    sqlite3.connect(path).close()
    with pytest.raises(StoreError):
        SQLiteStateStore(path, create=False)
    assert sqlite_tables(path) == set()


def test_newer_schema_refused(store: SQLiteStateStore, db_path: Path) -> None:
    store.close()
    with sqlite3.connect(db_path) as db:
        db.execute("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(SchemaMismatch, match="9999"):
        SQLiteStateStore(db_path)


def test_foreign_database_refused(tmp_path: Path) -> None:
    path = tmp_path / "foreign.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE effects (id INTEGER)")
    with pytest.raises(SchemaMismatch, match="not a ctrlrun ledger"):
        SQLiteStateStore(path)


def test_transaction_rolls_back_on_error(store: SQLiteStateStore) -> None:
    with pytest.raises(RuntimeError), store.transaction() as conn:
        L.advance_chain(conn)
        raise RuntimeError("boom")
    with store.reading() as conn:
        assert L.chain_head(conn)[0] == 0


@pytest.mark.parametrize(
    "url",
    ["not a url", "mysql://u@h/db", "sqlite://"],
)
def test_open_store_refuses_bad_urls(url: str) -> None:
    with pytest.raises(InvalidArgument):
        open_store(url)


def test_open_store_sqlite_url(tmp_path: Path) -> None:
    s = open_store(f"sqlite:///{tmp_path / 'a' / 'state.db'}")
    assert isinstance(s, SQLiteStateStore)
    s.close()
    assert (tmp_path / "a" / "state.db").exists()


OPENER = """
import sys, time
from ctrlrun import SQLiteStateStore
from ctrlrun.store import open_store
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
s = open_store(sys.argv[1])
s.ping()
s.close()
print("opened")
"""


@pytest.mark.timeout(60)
def test_fresh_sqlite_opened_by_six_processes(tmp_path: Path) -> None:
    path = tmp_path / "fresh" / "state.db"
    start = str(time.time() + 1.5)  # every process past its imports before the race begins
    results = run_parallel(OPENER, [[f"sqlite:///{path}", start]] * 6, timeout=45)
    for r in results:
        assert r.code == 0 and r.out.strip() == "opened", r.err
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [
            (HEAD_REVISION,)
        ]
        assert db.execute("SELECT count(*) FROM receipt_chain").fetchone() == (1,)
    assert sqlite_tables(path) >= TABLES


def test_postgres_store_opens_and_reopens(pg_url: str) -> None:
    s = open_store(pg_url)
    assert isinstance(s, PostgresStateStore)
    with s.reading() as conn:
        assert (
            conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == HEAD_REVISION
        )
    s.close()
    again = PostgresStateStore(pg_url.replace("+psycopg", ""), create=False)
    again.ping()
    again.close()


@pytest.mark.timeout(60)
def test_fresh_postgres_opened_by_six_processes(pg_url: str) -> None:
    start = str(time.time() + 1.5)
    results = run_parallel(OPENER, [[pg_url, start]] * 6, timeout=45)
    for r in results:
        assert r.code == 0 and r.out.strip() == "opened", r.err
    s = open_store(pg_url, create=False)
    with s.reading() as conn:
        assert conn.execute(text("SELECT count(*) FROM receipt_chain")).scalar() == 1
    s.close()


def test_postgres_lifecycle(pg_url: str) -> None:
    """The pipeline end to end on PostgreSQL: the same decisions as on SQLite."""
    from sdk_support import POLICY

    from ctrlrun import (
        Action,
        AmbiguousEffect,
        ApprovalRequired,
        Control,
        DuplicateEffect,
        EffectState,
        NotExecuted,
        Policy,
        Principal,
    )
    from ctrlrun.approvals import answer
    from ctrlrun.receipts import verify_chain

    store = open_store(pg_url)
    control = Control(Policy.from_yaml(POLICY), store)
    me = Principal("bot")

    def refund(payment_id: str, amount: int = 5) -> Action:
        return Action("refund", {"payment_id": payment_id, "amount": amount}, me)

    def lost() -> None:
        raise TimeoutError("lost")

    def declined() -> None:
        raise NotExecuted("declined")

    try:
        control.execute(refund("a"), lambda: None, "refund:a")
        with pytest.raises(DuplicateEffect):
            control.execute(refund("a"), lambda: None, "refund:a")
        with pytest.raises(NotExecuted):
            control.execute(refund("b"), declined, "refund:b")
        assert control.execute(refund("b"), lambda: 7, "refund:b")[1].attempt == 2
        with pytest.raises(TimeoutError):
            control.execute(refund("c"), lost, "refund:c")
        with pytest.raises(AmbiguousEffect):
            control.execute(refund("c"), lambda: None, "refund:c")
        _, receipt = control.execute(
            refund("c"), lambda: None, "refund:c", reconcile=lambda k: "not_executed"
        )
        assert receipt.attempt == 2
        with pytest.raises(ApprovalRequired) as info:
            control.execute(refund("d", 50_000), lambda: None, "refund:d")
        with store.transaction() as conn:
            answer(conn, info.value.request_id, grant=True, approver="t", now=control.clock())
        control.execute(
            refund("d", 50_000), lambda: None, "refund:d", approval_id=info.value.request_id
        )
        with store.reading() as conn:
            states = {r.effect_key: (r.state, r.attempt) for r in L.list_effects(conn)}
            report = verify_chain(conn)
        assert states == {
            "refund:a": (EffectState.COMMITTED, 1),
            "refund:b": (EffectState.COMMITTED, 2),
            "refund:c": (EffectState.COMMITTED, 2),
            "refund:d": (EffectState.COMMITTED, 1),
        }
        assert report.ok and report.verified == 8
    finally:
        store.close()


def test_timeline_condition_matches_the_partial_index_migration() -> None:
    """The planner uses the index only for the very condition it was created with."""
    import importlib.util

    from ctrlrun.schema import TIMELINE

    path = Path(__file__).parents[2] / "sdk" / "migrations" / "versions" / "r0003_timeline_index.py"
    spec = importlib.util.spec_from_file_location("r0003", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert str(TIMELINE) == module.TIMELINE
