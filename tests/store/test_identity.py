"""A SQLite ledger knows itself: refused at start when lost, never recreated, checked by the
doctor; a running store notices its file replaced (two stat calls a transaction)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ctrlrun.cli import main
from ctrlrun.identity import LedgerLost, marker_path
from ctrlrun.store import SQLiteStateStore, open_store


def made(path: Path) -> str:
    store = SQLiteStateStore(path)
    try:
        assert store.ledger_id is not None
        return store.ledger_id
    finally:
        store.close()


def test_first_run_creates_and_marks(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    ledger_id = made(db)
    assert marker_path(db).exists() and ledger_id in marker_path(db).read_text()
    assert made(db) == ledger_id  # reopened, never recreated


def test_a_deleted_ledger_is_not_recreated_unless_asked(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    old = made(db)
    db.unlink()
    with pytest.raises(LedgerLost, match=f"no ledger at .*{old} was created there"):
        SQLiteStateStore(db)
    assert not db.exists()
    new = SQLiteStateStore(db, new=True)
    new.close()
    assert new.ledger_id != old
    assert made(db) == new.ledger_id


def test_a_zero_byte_ledger_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    made(db)
    os.truncate(db, 0)
    with pytest.raises(LedgerLost, match=r"empty \(0 bytes\)"):
        open_store(f"sqlite:///{db}")
    with pytest.raises(LedgerLost, match=r"empty \(0 bytes\)"):
        open_store(f"sqlite:///{db}", create=False)


def test_a_replaced_file_is_refused_at_start(tmp_path: Path) -> None:
    db, other = tmp_path / "state.db", tmp_path / "other.db"
    made(db)
    made(other)
    os.replace(other, db)
    with pytest.raises(LedgerLost, match="the file was replaced"):
        SQLiteStateStore(db)


def test_a_running_store_refuses_once_its_file_is_replaced(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    store = SQLiteStateStore(db)
    try:
        with store.transaction():
            pass
        rounds = 2000
        started = time.perf_counter()
        for _ in range(rounds):
            store._guard()
        per_check = (time.perf_counter() - started) / rounds
        started = time.perf_counter()
        for _ in range(rounds // 10):
            with store.transaction():
                pass
        per_txn = (time.perf_counter() - started) / (rounds // 10)
        print(
            f"identity check: {per_check * 1e6:.1f} us per transaction "
            f"(an empty write transaction, check included: {per_txn * 1e6:.0f} us)"
        )
        made(tmp_path / "other.db")
        os.replace(tmp_path / "other.db", db)
        for _ in range(2):  # and it stays refused
            lost = pytest.raises(LedgerLost, match="was replaced by another file while in use")
            with lost, store.transaction():
                pass
        assert "lost" in marker_path(db).read_text()
    finally:
        store.close()


def test_doctor_checks_and_accepts(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    made(db)
    url = f"sqlite:///{db}"
    runner = CliRunner()
    ok = runner.invoke(main, ["doctor", "--store-url", url])
    assert ok.exit_code == 0, ok.output
    assert "integrity_check: ok" in ok.output and "chain intact" in ok.output
    made(tmp_path / "other.db")
    os.replace(tmp_path / "other.db", db)
    bad = runner.invoke(main, ["doctor", "--store-url", url])
    assert bad.exit_code == 1 and "FAIL  identity" in bad.output and "what to do" in bad.output
    accepted = runner.invoke(main, ["doctor", "--store-url", url, "--accept"])
    assert accepted.exit_code == 0, accepted.output
    made(db)  # trusted now
    os.truncate(db, 0)
    empty = runner.invoke(main, ["doctor", "--store-url", url, "--accept"])
    assert empty.exit_code == 1 and "0 bytes" in empty.output
