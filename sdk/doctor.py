"""``ctrlrun doctor``: is this ledger whole, is it the one created here, and what to do if not.

It reads the files itself (SQLite's ``PRAGMA integrity_check`` on a read-only connection, the
identity, the marker, the receipt chain) rather than opening a store: the store refuses a
ledger that was lost while in use, and the doctor is how an operator looks at one.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import create_engine
from sqlalchemy.engine import URL

from .config import parse_store_url, sqlite_file
from .errors import InvalidArgument
from .identity import NEW_LEDGER_HINT, marker_path, read_marker, write_marker
from .receipts import verify_chain


@dataclass(frozen=True)
class Finding:
    """One check: what was looked at, whether it holds, and what to do when it does not."""

    check: str
    ok: bool
    detail: str
    fix: str | None = None


def diagnose(url: str) -> list[Finding]:
    """Every check that applies to the ledger at ``url``; the first failing one may end it."""
    path = _sqlite_path(url)
    if path is None:
        return _diagnose_server(url)
    found: list[Finding] = []
    marker = read_marker(path)
    if path.is_dir():
        return [Finding("file", False, f"{path} is a directory", "name the ledger's file in it")]
    size = path.stat().st_size if path.exists() else None
    if not size:
        state = "missing" if size is None else "0 bytes"
        was = f"; ledger {marker['ledger_id']} was created there" if marker else ""
        fix = f"restore it, or {NEW_LEDGER_HINT}"
        return [Finding("file", False, f"{path} is {state}{was}", fix)]
    found.append(Finding("file", True, f"{path}: {size} bytes"))
    try:
        with closing(sqlite3.connect(f"{_file_uri(path)}?mode=ro", uri=True)) as conn:
            trouble = _integrity(conn)
            identity = _read_identity(conn)
    except sqlite3.DatabaseError as exc:  # not a database (or its header is lost), unreadable
        fix = f"if it is the ledger, restore it from a backup; if not, {_ELSEWHERE}"
        return [*found, Finding("integrity", False, f"{path} cannot be read: {exc}", fix)]
    if trouble is not None:
        return [*found, trouble]
    found.append(Finding("integrity", True, "PRAGMA integrity_check: ok"))
    found.append(_identity(path, identity, marker))
    if marker is not None and "lost" in marker:
        fix = f"restore the ledger, then run ctrlrun doctor --store-url {url} --accept"
        found.append(Finding("in use", False, f"lost while in use: {marker['lost']}", fix))
    found.append(_chain(URL.create("sqlite", database=_file_uri(path), query=READ_ONLY)))
    return found


READ_ONLY = {"mode": "ro", "uri": "true"}  # for pysqlite: the file: URI, read only
_ELSEWHERE = "point --store-url at the ledger (the proxy's --store-url, or .ctrlrun/state.db)"


def _file_uri(path: Path) -> str:
    # SQLite reads "?" and "#" in a file: URI as its query and fragment: quoted, they stay
    # part of the name.
    return "file:" + quote(str(path), safe="/")


def _integrity(conn: sqlite3.Connection) -> Finding | None:
    """A failing finding if the file is damaged or holds no ledger; None if it is whole."""
    problems = [str(r[0]) for r in conn.execute("PRAGMA integrity_check(20)")]
    if problems != ["ok"]:
        fix = "restore it from a backup (sqlite3 state.db '.recover' may save some of it)"
        return Finding("integrity", False, "; ".join(problems[:3]), fix)
    tables = {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    missing = sorted({"effects", "events", "receipts"} - tables)
    if missing:
        fix = _ELSEWHERE[0].upper() + _ELSEWHERE[1:]
        detail = f"a SQLite database, but not a ctrlrun ledger (no {', '.join(missing)} table)"
        return Finding("integrity", False, detail, fix)
    return None


def _read_identity(conn: sqlite3.Connection) -> str | None:
    try:
        row = conn.execute("SELECT ledger_id FROM ledger_identity").fetchone()
    except sqlite3.OperationalError:  # older than revision 0016: it gets one when next opened
        return None
    return None if row is None else str(row[0])


def _identity(path: Path, identity: str | None, marker: dict[str, str] | None) -> Finding:
    if marker is None or marker["ledger_id"] == identity:
        return Finding("identity", True, f"ledger {identity}")
    fix = f"put ledger {marker['ledger_id']} back, or accept this one (--accept)"
    return Finding(
        "identity",
        False,
        f"the file is ledger {identity}, but {marker['ledger_id']} was created there",
        fix,
    )


def _chain(url: URL) -> Finding:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            report = verify_chain(conn)
    finally:
        engine.dispose()
    if report.ok:
        return Finding("receipt chain", True, f"{report.verified} receipts, chain intact")
    first = report.breaks[0]
    detail = f"{len(report.breaks)} breaks; first at seq {first.seq}: {first.detail}"
    return Finding("receipt chain", False, detail, "ctrlrun receipts --verify-chain names them")


def _diagnose_server(url: str) -> list[Finding]:
    from .store import open_store

    store = open_store(url, create=False)
    try:
        found = [Finding("identity", True, f"ledger {store.ledger_id} at {store.location}")]
        with store.reading() as conn:
            report = verify_chain(conn)
    finally:
        store.close()
    if report.ok:
        found.append(Finding("receipt chain", True, f"{report.verified} receipts, chain intact"))
    else:
        found.append(Finding("receipt chain", False, f"{len(report.breaks)} breaks", None))
    return found


def _sqlite_path(url: str) -> Path | None:
    """The file of a SQLite ledger URL; None for another kind of URL."""
    parsed = parse_store_url(url)
    if not parsed.drivername.startswith("sqlite"):
        return None
    return Path(sqlite_file(parsed))


def accept(url: str) -> str:
    """Trust the SQLite ledger at ``url`` as it is now: the marker takes its identity."""
    path = _sqlite_path(url)
    if path is None:
        raise InvalidArgument("--accept applies to a SQLite ledger")
    with closing(sqlite3.connect(f"{_file_uri(path)}?mode=ro", uri=True)) as conn:
        identity = _read_identity(conn)
    if identity is None:
        raise InvalidArgument(f"{path} has no ledger identity; open it once with ctrlrun first")
    write_marker(path, identity)
    return f"{marker_path(path)}: ledger {identity} accepted"
