"""Revision 0018: the index no query used is gone, on a fresh ledger and on an upgraded one,
and what a protected call writes to SQLite's log shrank with it."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import inspect, text

from ctrlrun import Control, Policy, context, protect
from ctrlrun.store import HEAD_REVISION, open_store

from .conftest import WRITE_POLICY
from .test_conformance import migrate_to, raw_engine


def event_indexes(url: str) -> set[str]:
    engine = raw_engine(url)
    try:
        with engine.connect() as conn:
            return {ix["name"] for ix in inspect(conn).get_indexes("events") if ix["name"]}
    finally:
        engine.dispose()


def test_a_fresh_ledger_has_no_index_of_events_by_type(store_url: str) -> None:
    open_store(store_url).close()
    found = event_indexes(store_url)
    assert "events_by_type" not in found
    # The indexes that queries use are all there.
    assert {"events_by_action", "events_timeline"} <= found


def test_an_upgraded_ledger_drops_it_and_keeps_its_events(store_url: str) -> None:
    migrate_to(store_url, "0017")
    assert "events_by_type" in event_indexes(store_url)
    store = open_store(store_url)
    try:
        with store.reading() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == (
                HEAD_REVISION
            )
        control = Control(Policy.from_yaml(WRITE_POLICY), store)
        write = protect("bench.write", effect="w:{n}", control=control)(lambda n: n)
        with context(agent="bench"):
            assert write(1) == 1
        with store.reading() as conn:
            types = [r[0] for r in conn.execute(text("SELECT type FROM events ORDER BY event_id"))]
    finally:
        store.close()
    assert "events_by_type" not in event_indexes(store_url)
    assert types == [
        "ACTION_PROPOSED",
        "POLICY_EVALUATED",
        "EFFECT_RESERVED",
        "EXECUTION_STARTED",
        "EXECUTION_COMMITTED",
    ]


def test_a_protected_call_writes_fewer_log_pages(tmp_path: Path) -> None:
    """Each commit writes every page it dirtied into the WAL: count the frames of 200 calls."""
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        control = Control(Policy.from_yaml(WRITE_POLICY), store)
        write = protect("bench.write", effect="w:{n}", control=control)(lambda n: n)
        with context(agent="bench"):
            for n in range(300):  # past the tables' first pages
                write(n)
            store._checkpointer.stop()  # type: ignore[union-attr]  # nothing copies the log now
            with store.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            for n in range(300, 500):
                write(n)
        wal = (tmp_path / "state.db-wal").stat().st_size
    finally:
        store.close()
    frames = wal / (4096 + 24)
    # Revision 0017 wrote about 26 frames per call (two commits), 0018 about 19.
    assert frames / 200 < 22, frames / 200
