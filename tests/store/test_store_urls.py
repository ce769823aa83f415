"""Store URLs and the files they name: what is not a ledger gets one line, never a traceback,
and a file whose name holds ``?`` or ``#`` is the file written (not the name cut at them)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

import ctrlrun
from ctrlrun.cli import main
from ctrlrun.config import sqlite_url, store_url
from ctrlrun.errors import InvalidArgument
from ctrlrun.store import PostgresStateStore, SQLiteStateStore, open_store

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  t.write:
    effect: "w:{n}"
    decision: allow
"""


def doctor(*args: str) -> tuple[int, str]:
    got = CliRunner().invoke(main, ["doctor", *args])
    assert got.exception is None or isinstance(got.exception, SystemExit), got.exception
    assert "Traceback" not in got.output
    return got.exit_code, got.output


@pytest.mark.parametrize("url", ["junk.db", "not a url", "sqlite://", "sqlite:///"])
def test_the_doctor_says_in_one_line_what_is_wrong_with_the_url(url: str) -> None:
    code, out = doctor("--store-url", url)
    assert code == 2 and len(out.strip().splitlines()) == 1, out
    assert "store URL" in out


def test_the_doctor_fails_what_is_not_a_ledger_and_accepts_none_of_it(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(os.urandom(8192))
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    cases = [
        (junk, "integrity", "cannot be read: file is not a database"),
        (other, "integrity", "not a ctrlrun ledger (no effects, events, receipts table)"),
        (tmp_path, "file", "is a directory"),
    ]
    for path, check, says in cases:
        code, out = doctor("--store-url", sqlite_url(path))
        assert code == 1 and f"FAIL  {check}: " in out and says in out, out
        assert "what to do: " in out
        code, out = doctor("--store-url", sqlite_url(path), "--accept")
        assert code == 1 and "not accepted" in out, out


def test_a_ledger_whose_name_holds_a_question_mark_is_that_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "we?ird#dir"
    folder.mkdir()
    db = folder / "state.db"
    store = SQLiteStateStore(db)
    control = ctrlrun.Control(ctrlrun.Policy.from_yaml(POLICY), store)
    write = ctrlrun.protect("t.write", control=control)(lambda n: n)
    with ctrlrun.context(agent="t"):
        assert write(1) == 1
    store.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["we?ird#dir"]  # no stray "we"
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT effect_key, state FROM effects").fetchall() == [
            ("w:1", "committed")
        ]
    # Its URL escapes them, and every entrance reads that URL back to the same file.
    monkeypatch.setenv("CTRLRUN_STATE", str(db))
    monkeypatch.delenv("CTRLRUN_STORE_URL", raising=False)
    url = store_url()
    assert "%3F" in url and "%23" in url
    reopened = open_store(url, create=False)
    assert reopened.ledger_id == store.ledger_id
    reopened.close()
    code, out = doctor()
    assert code == 0 and "1 receipts, chain intact" in out, out
    receipts = CliRunner().invoke(main, ["receipts"])
    assert receipts.exit_code == 0 and "w:1" in receipts.output


def test_a_sqlite_url_with_a_query_is_refused_not_cut_short(tmp_path: Path) -> None:
    for url in (f"sqlite:///{tmp_path}/we?ird.db", f"sqlite:///{tmp_path}/a.db?mode=ro"):
        with pytest.raises(InvalidArgument, match=r"takes no query.*%3F"):
            open_store(url)
    assert list(tmp_path.iterdir()) == []


def test_a_postgres_store_given_no_url_says_so() -> None:
    pytest.importorskip("psycopg")
    with pytest.raises(InvalidArgument, match="not a store URL: 'garbage'"):
        PostgresStateStore("garbage")
