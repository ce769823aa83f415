"""A ledger knows itself: its identity, and the files a process opened it through.

A ledger gets a UUID when it is created (migration 0016). A SQLite ledger also leaves a small
marker beside its file (``.state.db.ctrlrun-ledger``, holding that UUID), so that a later start
can tell "never created here" (create it: the first run) from "created here and since lost"
(refuse: recreating it empty would forget every acknowledged effect, and the agent's retries
would run again). A running process remembers the device and inode of the file and of its WAL
and checks them, with two ``stat`` calls, before each transaction; a file deleted, replaced or
truncated, or a WAL removed, under it makes the store refuse every later transaction with one
line saying what happened and what to do. The refusal stays until an operator restarts it:
what was written since cannot be trusted to be where the next process will look.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, select

from .config import sqlite_url
from .errors import StoreError
from .schema import ledger_identity

log = logging.getLogger(__name__)

NEW_LEDGER_HINT = "start ctrlrun proxy with --create-ledger (SDK: new=True) for a new, empty one"


class LedgerLost(StoreError):
    """The ledger is not (or no longer) the one this process opened, or was created at."""


def read_identity(conn: Connection) -> str | None:
    row = conn.execute(select(ledger_identity.c.ledger_id)).first()
    return None if row is None else str(row[0])


def marker_path(path: Path) -> Path:
    """Beside the ledger, dot-named so that ``rm state.db*`` does not take it along."""
    return path.with_name(f".{path.name}.ctrlrun-ledger")


def read_marker(path: Path) -> dict[str, str] | None:
    """What the marker says (``ledger_id``, and ``lost`` once a process saw the ledger lost)."""
    try:
        data = json.loads(marker_path(path).read_text("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise LedgerLost(f"cannot read {marker_path(path)}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("ledger_id"), str):
        raise LedgerLost(f"{marker_path(path)} names no ledger_id; remove it if it is not ours")
    return {k: str(v) for k, v in data.items()}


def known_identity(path: Path) -> str | None:
    marker = read_marker(path)
    return None if marker is None else marker["ledger_id"]


def write_marker(path: Path, ledger_id: str, *, lost: str | None = None) -> None:
    marker = marker_path(path)
    tmp = marker.with_name(f"{marker.name}.{os.getpid()}.tmp")
    data = {"ledger_id": ledger_id, "ledger": path.name, **({"lost": lost} if lost else {})}
    try:
        tmp.write_text(json.dumps(data) + "\n")
        os.replace(tmp, marker)
    except OSError as exc:  # a read-only directory: the start-up check is lost, not the ledger
        log.warning("cannot write %s (%s): a lost ledger will not be noticed at start", marker, exc)


def check_at_start(path: Path, *, new: bool) -> None:
    """Refuse to open a 0-byte ledger, or to recreate one that was created here and lost."""
    if new:
        return
    marker = read_marker(path)
    if marker is None:
        # Never created here: a first run. (A file another process is creating right now is
        # 0 bytes until its first statement switches it to WAL, which writes its first page.)
        return
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        size = None
    if size == 0:
        raise LedgerLost(
            f"the ledger at {path} is empty (0 bytes): it was truncated. "
            f"Restore it from a backup, or {NEW_LEDGER_HINT}"
        )
    if size is None:
        raise LedgerLost(
            f"no ledger at {path}, but ledger {marker['ledger_id']} was created there: it was "
            f"deleted or moved. Restore it from a backup, or {NEW_LEDGER_HINT}"
        )
    if "lost" in marker:
        raise LedgerLost(
            f"the ledger at {path} was lost while in use ({marker['lost']}). Restore it, then "
            f"clear this with `ctrlrun doctor --store-url {sqlite_url(path)} --accept`"
        )


def check_identity(path: Path, found: str | None, *, new: bool) -> None:
    """Refuse a file that is not the ledger created here (unless a new one was asked for)."""
    known = known_identity(path)
    if known is None or new or known == found:
        return
    raise LedgerLost(
        f"the ledger at {path} is {found}, not {known}, the one created there: the file was "
        f"replaced. Put the right one back, or remove {marker_path(path)} to accept this one"
    )


@dataclass
class FileWatch:
    """The device and inode of a SQLite ledger and its WAL as this process opened them."""

    path: Path
    wal: Path
    file_id: tuple[int, int]
    wal_id: tuple[int, int] | None = None  # known once this process has written (it keeps it)

    @classmethod
    def open(cls, path: Path) -> FileWatch:
        st = path.stat()
        watch = cls(path, Path(f"{path}-wal"), (st.st_dev, st.st_ino))
        watch.written()
        return watch

    def problem(self) -> str | None:
        """What happened to the files since they were opened, or None."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return "was deleted"
        if (st.st_dev, st.st_ino) != self.file_id:
            return "was replaced by another file"
        if st.st_size == 0:
            return "was truncated to 0 bytes"
        if self.wal_id is None:
            return None
        try:
            wal = os.stat(self.wal)
        except FileNotFoundError:
            return "lost its write-ahead log (the -wal file was removed)"
        if (wal.st_dev, wal.st_ino) != self.wal_id:
            return "had its write-ahead log replaced"
        return None

    def written(self) -> None:
        """After this process's first commit: the WAL exists, and stays while it is open."""
        if self.wal_id is None:
            try:
                st = os.stat(self.wal)
            except FileNotFoundError:
                return
            self.wal_id = (st.st_dev, st.st_ino)


def session_lost(dbapi_conn: Any, expected: str | None, location: str) -> LedgerLost | None:
    """Whether a new PostgreSQL session reached another ledger than the one opened."""
    cur = dbapi_conn.cursor()
    try:
        cur.execute("SELECT ledger_id FROM ledger_identity")
        row = cur.fetchone()
    finally:
        cur.close()
        dbapi_conn.rollback()
    found = None if row is None else str(row[0])
    if found == expected:
        return None
    return LedgerLost(
        f"the ledger at {location} is {found}, not {expected}, the one this process opened: "
        "the database was recreated. Protected writes are refused; check it with "
        "`ctrlrun doctor`, restore it, then restart"
    )


def rescue(anchor: sqlite3.Connection, path: Path) -> Path | None:
    """Copy the ledger as this process still sees it (through ``anchor``) beside it."""
    target = path.with_name(f"{path.name}.rescued-{int(time.time())}")
    try:
        copy = sqlite3.connect(target)
        try:
            anchor.backup(copy)
            ok = copy.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        finally:
            copy.close()
    except (sqlite3.Error, OSError) as exc:
        log.error("could not save the ledger %s was using: %s", path, exc)
        ok = False
    if not ok:  # a copy of a truncated file is not evidence: do not leave it to be trusted
        target.unlink(missing_ok=True)
        return None
    return target


def note_lost(path: Path, ledger_id: str | None, what: str, rescued: Path | None) -> None:
    """Leave the loss in the marker, so no later start trusts the ledger until told to."""
    if ledger_id is not None:
        saved = f"; saved copy {rescued}" if rescued else ""
        write_marker(path, ledger_id, lost=f"it {what}{saved}")


def lost_message(path: Path, what: str, rescued: Path | None) -> str:
    saved = (
        f"what this process held was saved to {rescued}; "
        if rescued is not None
        else "nothing could be saved from it; "
    )
    return (
        f"the ledger at {path} {what} while in use: protected writes are refused ({saved}"
        f"stop this process, check the ledger with `ctrlrun doctor --store-url "
        f"{sqlite_url(path)}`, restore it, then restart)"
    )
