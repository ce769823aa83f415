"""How the SQLite ledger's connections are set up, and how its write transactions begin."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from sqlalchemy import Connection

BUSY_TIMEOUT_MS = 30000  # how long a writer waits for the write lock (a batch on the loop: 0)


def begin_immediate(conn: Connection) -> None:
    """``BEGIN IMMEDIATE`` sent by the driver, in a transaction SQLAlchemy knows of (its
    ``begin()`` sends nothing on SQLite): ``exec_driver_sql`` cost ~20 µs of Python more."""
    conn.begin()
    try:
        conn.connection.dbapi_connection.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]
    except BaseException:
        conn.rollback()
        raise


def sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
    # The driver must not open transactions on its own: every transaction is ours, and
    # decisions take the write lock at BEGIN (IMMEDIATE), not at their first write.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    # Switching a fresh file to WAL needs a moment alone with it, and SQLite may refuse at once
    # (no busy handler) while another process is doing the same: try again, briefly.
    for attempt in range(100):
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError:
            if attempt == 99:
                raise
            time.sleep(0.05)
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA journal_size_limit=67108864")  # a reset WAL shrinks back to 64 MiB
    # Checkpoints run in the background (see Checkpointer), not inside a decision's COMMIT.
    cur.execute("PRAGMA wal_autocheckpoint=0")
    cur.close()
