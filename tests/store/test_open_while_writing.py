"""Opening a current SQLite ledger never waits behind its writers (readers, the CLI)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from sqlalchemy import text

from ctrlrun.store import SQLiteStateStore


def test_a_reader_opens_a_ledger_while_a_writer_holds_its_lock(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    SQLiteStateStore(path).close()
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # a long decision, or another sidecar's group commit
    try:
        started = time.monotonic()
        reader = SQLiteStateStore(path, create=False)  # waited up to 30 s for the lock
        with reader.reading() as conn:
            assert conn.execute(text("SELECT count(*) FROM effects")).scalar() == 0
        reader.close()
        assert time.monotonic() - started < 5
    finally:
        writer.execute("ROLLBACK")
        writer.close()
