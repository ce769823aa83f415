"""The SQLite ledger's checkpointer starts the WAL over even while writers keep it busy."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from ctrlrun.checkpoint import Checkpointer


def _writer(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE IF NOT EXISTS t (b BLOB)")
    return conn


def _write(conn: sqlite3.Connection, rows: int) -> None:
    for _ in range(rows):  # a frame or two each, as decisions are
        conn.execute("INSERT INTO t VALUES (randomblob(3000))")


def _log_frames(path: Path) -> int:
    probe = sqlite3.connect(path, isolation_level=None)
    try:
        return int(probe.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1])
    finally:
        probe.close()


def _busy_log(path: Path) -> sqlite3.Connection:
    """A log the passive checkpoint cannot finish: a reader holds a snapshot in its middle."""
    writer = _writer(path)
    _write(writer, 600)
    reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM t").fetchone()
    _write(writer, 900)
    threading.Timer(0.03, lambda: reader.execute("COMMIT")).start()
    return writer


def test_a_round_restarts_a_log_writers_kept_from_completing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    writer = _busy_log(path)
    conn = sqlite3.connect(path, timeout=Checkpointer.RESTART_WAIT * 20, isolation_level=None)
    assert Checkpointer.round(conn) is True
    _write(writer, 1)
    assert _log_frames(path) < 10  # the next commit wrote at the log's start


def test_without_the_restart_the_log_only_grows(tmp_path: Path) -> None:
    # What the restart is for: a passive checkpoint alone leaves the log to grow.
    path = tmp_path / "ledger.db"
    writer = _busy_log(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    threading.Event().wait(0.1)
    _write(writer, 1)
    assert _log_frames(path) > Checkpointer.RESTART_FRAMES


def test_a_short_log_is_left_to_passive_checkpoints(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    _write(_writer(path), 10)
    assert Checkpointer.round(sqlite3.connect(path, isolation_level=None)) is False


def test_a_truncated_ledger_is_never_checkpointed_into(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    writer = _writer(path)
    _write(writer, 1)
    gone = threading.Event()
    checkpointer = Checkpointer(path, lambda: "was truncated to 0 bytes" if gone.is_set() else None)
    try:
        # A reader's snapshot holds the checkpoints back from what is written after it.
        reader = sqlite3.connect(path, isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM t").fetchone()
        _write(writer, 50)
        time.sleep(2 * Checkpointer.INTERVAL)
        os.truncate(path, 0)
        gone.set()
        reader.close()
        time.sleep(6 * Checkpointer.INTERVAL)
        checkpointer.stop()
        # A checkpoint would have written the logged pages back: the file would look whole.
        assert path.stat().st_size == 0
    finally:
        checkpointer.stop()
        writer.close()  # the last connection's close checkpoints: after the assertion


def test_a_ledger_that_cannot_be_looked_at_is_not_checkpointed_into(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "c.db"
    writer = _writer(path)

    def problem() -> str | None:
        raise PermissionError("stat refused")

    checkpointer = Checkpointer(path, problem)
    try:
        with caplog.at_level(logging.WARNING, logger="ctrlrun.checkpoint"):
            time.sleep(4 * Checkpointer.INTERVAL)
        assert not checkpointer._thread.is_alive()
        # Said and stopped, not an exception out of the thread.
        assert any("could not be looked at" in r.getMessage() for r in caplog.records)
    finally:
        checkpointer.stop()
        writer.close()
