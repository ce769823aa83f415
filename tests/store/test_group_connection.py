"""The SQLite writers' connection is kept from one group to the next, and thrown away when a
COMMIT or ROLLBACK on it fails; the next transaction then works on a fresh one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, event, text

from ctrlrun.errors import StoreError
from ctrlrun.store import SQLiteStateStore


def _checkouts(store: SQLiteStateStore) -> list[int]:
    seen: list[int] = []
    event.listen(store.engine, "checkout", lambda dbapi, _rec, _proxy: seen.append(id(dbapi)))
    return seen


def _head(conn: Connection) -> int:
    return int(conn.execute(text("SELECT seq FROM receipt_chain WHERE id = 1")).scalar_one())


def test_one_connection_serves_every_transaction(tmp_path: Path) -> None:
    store = SQLiteStateStore(tmp_path / "state.db")
    try:
        seen = _checkouts(store)
        for _ in range(50):
            with store.transaction() as conn:
                conn.exec_driver_sql("UPDATE receipt_chain SET seq = seq + 1 WHERE id = 1")
        with store.reading() as conn:
            assert _head(conn) == 50  # every one of them committed
        assert len(seen) <= 2  # the writers' connection (and the reader's)
    finally:
        store.close()


def test_a_body_that_raises_leaves_the_connection_usable(tmp_path: Path) -> None:
    store = SQLiteStateStore(tmp_path / "state.db")
    try:
        with pytest.raises(ValueError), store.transaction() as conn:
            conn.exec_driver_sql("UPDATE receipt_chain SET seq = 7 WHERE id = 1")
            raise ValueError("refused")
        with store.transaction() as conn:
            assert _head(conn) == 0  # undone
            conn.exec_driver_sql("UPDATE receipt_chain SET seq = 1 WHERE id = 1")
        with store.reading() as conn:
            assert _head(conn) == 1
    finally:
        store.close()


def test_a_failed_commit_throws_the_connection_away(tmp_path: Path) -> None:
    store = SQLiteStateStore(tmp_path / "state.db")
    try:
        seen = _checkouts(store)
        with store.transaction() as conn:
            conn.exec_driver_sql("SELECT 1")
        kept = seen[-1]
        with store.transaction() as conn:
            conn.exec_driver_sql("UPDATE receipt_chain SET seq = 5 WHERE id = 1")
        # The next COMMIT fails: the driver connection is closed under the body.
        with pytest.raises(StoreError), store.transaction() as conn:
            conn.exec_driver_sql("UPDATE receipt_chain SET seq = 9 WHERE id = 1")
            raw: Any = conn.connection.dbapi_connection
            raw.close()
        with store.transaction() as conn:  # a fresh connection, and the ledger as it was
            assert _head(conn) == 5
            conn.exec_driver_sql("UPDATE receipt_chain SET seq = 6 WHERE id = 1")
        assert seen[-1] != kept
        with store.reading() as conn:
            assert _head(conn) == 6
    finally:
        store.close()


def test_closing_the_store_closes_the_kept_connection(tmp_path: Path) -> None:
    store = SQLiteStateStore(tmp_path / "state.db")
    closed: list[int] = []
    event.listen(store.engine, "close", lambda dbapi, _rec: closed.append(1))
    with store.transaction() as conn:
        conn.exec_driver_sql("SELECT 1")
    store.close()
    assert closed  # no connection is left open on the file
