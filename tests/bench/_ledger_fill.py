"""Filling a ledger fast, for ``bench_ledger.py``: the rows ``@protect`` would write, in bulk.

Calling ``protect`` a million times takes most of an hour; this writes the same rows directly,
with SQLAlchemy Core ``executemany`` (``insert(table)`` compiled once, rows as tuples in its
column order) in transactions of ``BATCH`` effects, into a SQLite file
that ``SQLiteStateStore`` created (so the schema is exactly what the Alembic migrations make).
Each effect gets what one allowed call leaves behind: its record, five events
(``ACTION_PROPOSED`` … ``EXECUTION_COMMITTED``) and a receipt whose ``seq``, ``prev_hash`` and
``hash`` continue the chain, hashed with the library's own canonical encoding. One effect in a
thousand is left ``ambiguous`` after a sweep that learned nothing; one in a hundred was ambiguous
and then reconciled to ``committed``. Secondary indexes are dropped for the fill and rebuilt from
their own ``CREATE INDEX`` text afterwards, which is several times faster than maintaining them
row by row and leaves the same schema.

The file is cached under the cache directory, keyed by schema revision, fill format and size,
and written under a temporary name first, so an interrupted fill is never reused.
PostgreSQL gets a copy of a cached file through ``COPY`` (``copy_to_postgres``).
"""

from __future__ import annotations

import ast
import json
import os
import random
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Table, create_engine, insert
from sqlalchemy.engine import Dialect

from ctrlrun import Policy, SQLiteStateStore
from ctrlrun.action import canonical_bytes, sha256
from ctrlrun.identity import marker_path
from ctrlrun.receipts import RECEIPT_SCHEMA, verify_chain
from ctrlrun.schema import GENESIS_HASH, events, receipts
from ctrlrun.schema import effects as effects_table
from ctrlrun.store import HEAD_REVISION, PostgresStateStore

FILL_FORMAT = 2  # bump whenever the generated rows change: cached files are then rebuilt
BATCH = 50_000  # effects per transaction
BASE_MS = 1_735_689_600_000  # 2025-01-01T00:00:00Z; effect i starts 30 ms after effect i-1
STEP_MS = 30
AMBIGUOUS_EVERY = 1000  # effect i with i % 1000 == 500 is left ambiguous
RESOLVED_EVERY = 100  # effect i with i % 100 == 50 was ambiguous, then reconciled
ACTION = "bench.write"
AGENT = "bench"
_WORKER = Path(__file__).resolve().parent / "_protect_worker.py"


def bench_policy_text() -> str:
    """The policy the benchmark workers use (``POLICY`` in ``_protect_worker.py``)."""
    tree = ast.parse(_WORKER.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "POLICY" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, str)
            return value
    raise RuntimeError(f"no POLICY in {_WORKER}")


@dataclass(frozen=True)
class FillReport:
    """What a fill wrote and how long it took."""

    path: Path
    effects: int
    events: int
    receipts: int
    ambiguous: int
    seconds: float
    cached: bool


def cache_path(cache_dir: Path, size: int) -> Path:
    return cache_dir / f"ledger-r{HEAD_REVISION}-f{FILL_FORMAT}-{size}.db"


def cached_sqlite(cache_dir: Path, size: int, *, max_seconds: float) -> FillReport:
    """The cached ledger of ``size`` effects, filled first if it is not there yet."""
    path = cache_path(cache_dir, size)
    if path.exists():
        counts = _counts(path)
        if counts["effects"] == size:
            return FillReport(
                path, size, counts["events"], counts["receipts"], counts["ambiguous"], 0.0, True
            )
        path.unlink()  # not what this format writes: rebuild it
    return fill_sqlite(path, size, max_seconds=max_seconds)


def _counts(path: Path) -> dict[str, int]:
    db = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)  # no -shm beside it
    try:
        return {
            "effects": db.execute("SELECT max(rowid) FROM effects").fetchone()[0] or 0,
            "events": db.execute("SELECT max(event_id) FROM events").fetchone()[0] or 0,
            "receipts": db.execute("SELECT seq FROM receipt_chain").fetchone()[0] or 0,
            "ambiguous": db.execute(
                "SELECT count(*) FROM effects WHERE state = 'ambiguous'"
            ).fetchone()[0],
        }
    finally:
        db.close()


def fill_sqlite(path: Path, size: int, *, max_seconds: float) -> FillReport:
    """Write a fresh ledger of ``size`` effects at ``path`` (via a temporary file)."""
    started = time.monotonic()
    deadline = started + max_seconds
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
        leftover.unlink(missing_ok=True)
    SQLiteStateStore(tmp).close()  # the migrations make the schema
    engine = create_engine(f"sqlite:///{tmp}")
    try:
        with engine.connect() as conn:
            # A throwaway file until it is renamed: no journal, no fsync, a big page cache.
            for pragma in (
                "journal_mode=OFF",
                "synchronous=OFF",
                "cache_size=-400000",
                "temp_store=MEMORY",
            ):
                conn.exec_driver_sql(f"PRAGMA {pragma}")
            indexes = [
                sql
                for (sql,) in conn.exec_driver_sql(
                    "SELECT sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL "
                    "AND tbl_name IN ('effects', 'events', 'receipts')"
                )
            ]
            for name in [sql.split()[2] for sql in indexes]:
                conn.exec_driver_sql(f"DROP INDEX {name}")
            conn.commit()
            n_events = n_ambiguous = 0
            head = (0, GENESIS_HASH)
            sql = {t.name: _insert_sql(t, conn.dialect) for t in (effects_table, events, receipts)}
            for batch in generate(size):
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"filling {size} effects took longer than {max_seconds:.0f} s"
                    )
                conn.exec_driver_sql(sql["effects"], batch.effects)
                conn.exec_driver_sql(sql["events"], batch.events)
                conn.exec_driver_sql(sql["receipts"], batch.receipts)
                conn.commit()
                n_events += len(batch.events)
                n_ambiguous += batch.ambiguous
                head = batch.head
            conn.exec_driver_sql("UPDATE receipt_chain SET seq = ?, hash = ? WHERE id = 1", head)
            for sql in indexes:
                conn.exec_driver_sql(sql)
            conn.commit()
            conn.exec_driver_sql("PRAGMA journal_mode=WAL")
    finally:
        engine.dispose()
    if size <= 100_000:  # a self-check of the hashing; a million would take a while
        store = SQLiteStateStore(tmp, create=False)
        try:
            with store.reading() as conn:
                report = verify_chain(conn)
            if not report.ok:
                raise RuntimeError(f"the filled chain does not verify: {report.breaks[:3]}")
        finally:
            store.close()
    os.replace(tmp, path)
    # A new ledger under the cached name: forget the identity of the one it replaces.
    for marker in (marker_path(tmp), marker_path(path)):
        marker.unlink(missing_ok=True)
    return FillReport(path, size, n_events, size, n_ambiguous, time.monotonic() - started, False)


def _insert_sql(table: Table, dialect: Dialect) -> str:
    """``INSERT INTO table (every column) VALUES (?, …)``, checked against ``COLUMNS``."""
    compiled = insert(table).compile(dialect=dialect)
    if list(compiled.positiontup or ()) != COLUMNS[table.name]:
        raise RuntimeError(f"the {table.name} columns changed: update COLUMNS and generate()")
    return str(compiled)


# The order generate() writes each row's values in. Spelled out, not read from the schema:
# a column added to a table must fail the fill here, by name, until generate() writes it.
COLUMNS = {
    "effects": [
        *("effect_key", "state", "action_id", "attempt", "lease_expires_at", "action_name"),
        *("action_json", "idempotency_key", "upstream", "result_json", "error", "resolved_by"),
        *("created_at", "updated_at", "attempt_started_at", "committed_at"),
        *("next_check_at", "checks", "check_answer", "check_attempt"),
        *("lease_holder", "lease_steady_until", "committed_steady", "committed_on"),
    ],
    "events": ["event_id", "ts", "type", "action_id", "effect_key", "approval_id", "data_json"],
    "receipts": [
        *("receipt_id", "action_id", "effect_key", "result", "json", "ts", "seq"),
        *("prev_hash", "hash", "event_pos", "action"),
    ],
}
Row = tuple[Any, ...]


@dataclass
class Batch:
    """Rows (tuples in ``COLUMNS`` order) for up to ``BATCH`` effects, and the chain head."""

    effects: list[Row]
    events: list[Row]
    receipts: list[Row]
    head: tuple[int, str]
    ambiguous: int


class _Clock:
    """ISO timestamps for milliseconds since the epoch, re-formatting only the seconds part."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def iso(self, ms: int) -> str:
        second = ms // 1000
        if second != self._second:
            self._second = second
            self._prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        return f"{self._prefix}{ms % 1000:03d}Z"


def generate(size: int, *, seed: int = 20250101) -> Iterator[Batch]:
    """The rows of ``size`` allowed calls of ``bench.write`` with ``n`` = 0 … size-1."""
    rng = random.Random(seed)
    clock = _Clock()
    policy_hash = Policy.from_yaml(bench_policy_text()).policy_hash
    principal = {"agent": AGENT, "user": None}
    # The action document, spelled as a format string; checked below against the library's.
    action_fmt = (
        '{"arguments":{"n":%d},"environment":"production","name":"'
        + ACTION
        + '","principal":{"agent":"'
        + AGENT
        + '","user":null},"resource":null,'
        '"schema":"ctrlrun.action/v1"}'
    )
    expected = canonical_bytes(
        {
            "arguments": {"n": 7},
            "environment": "production",
            "name": ACTION,
            "principal": principal,
            "resource": None,
            "schema": "ctrlrun.action/v1",
        }
    )
    if (action_fmt % 7).encode() != expected:
        raise RuntimeError("the action template no longer matches canonical_bytes")
    dumps = json.JSONEncoder(
        sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode
    seq, prev, event_id = 0, GENESIS_HASH, 0
    for start in range(0, size, BATCH):
        eff: list[Row] = []
        evs: list[Row] = []
        rcs: list[Row] = []
        n_amb = 0
        for n in range(start, min(start + BATCH, size)):
            key = f"w:{n}"
            action_id = f"act_{rng.getrandbits(128):032x}"
            action_json = action_fmt % n
            action_hash = sha256(action_json.encode())
            t0 = BASE_MS + n * STEP_MS
            ts0, ts1 = clock.iso(t0), clock.iso(t0 + 7)
            ambiguous = n % AMBIGUOUS_EVERY == 500
            resolved = not ambiguous and n % RESOLVED_EVERY == 50
            outcome = "ambiguous" if ambiguous or resolved else "committed"
            error = "TimeoutError: the remote did not answer" if outcome == "ambiguous" else None

            # (ts, type, data) of each event, in the order protect and a sweep write them.
            steps = [
                (ts0, "ACTION_PROPOSED", f'{{"action_hash":"{action_hash}"}}'),
                (ts0, "POLICY_EVALUATED", '{"decision":"allow","reason":"decision"}'),
                (
                    ts0,
                    "EFFECT_RESERVED",
                    f'{{"attempt":1,"lease_expires_at":"{clock.iso(t0 + 300_000)}"}}',
                ),
                (ts0, "EXECUTION_STARTED", "{}"),
                (ts1, "EXECUTION_COMMITTED", "{}")
                if outcome == "committed"
                else (ts1, "EXECUTION_AMBIGUOUS", dumps({"error": error})),
            ]
            finish_pos = event_id + len(steps)  # the receipt's event_pos: its execution event

            seq += 1
            doc = {
                "schema": RECEIPT_SCHEMA,
                "receipt_id": f"ctr_{rng.getrandbits(128):032x}",
                "action_id": action_id,
                "action": ACTION,
                "action_hash": action_hash,
                "arguments": {"n": n},
                "principal": principal,
                "resource": None,
                "environment": "production",
                "decision": "allow",
                "decision_reason": "decision",
                "approval_id": None,
                "approver": None,
                "effect_key": key,
                "attempt": 1,
                "result": outcome,
                "error": error,
                "policy_hash": policy_hash,
                "started_at": ts0,
                "finished_at": ts1,
                "seq": seq,
                "prev_hash": prev,
            }
            body = dumps(doc)
            digest = sha256(body.encode("utf-8"))
            rcs.append(
                (
                    doc["receipt_id"],
                    action_id,
                    key,
                    outcome,
                    body,
                    ts1,
                    seq,
                    prev,
                    digest,
                    finish_pos,
                    ACTION,
                )
            )
            prev = digest

            updated, resolved_by, committed_at = (
                ts1,
                None,
                (ts1 if outcome == "committed" else None),
            )
            # next_check_at, checks, check_answer, check_attempt (revision 0004): never asked
            checks: tuple[str | None, int | None, str | None, int | None] = (None,) * 4
            if ambiguous or resolved:  # a sweep a minute later asks the remote
                ts2 = clock.iso(t0 + 60_000)
                answer = "committed" if resolved else "unknown"
                steps.append(
                    (ts2, "RECONCILIATION_STARTED", dumps({"effect_key": key, "trigger": "sweep"}))
                )
                steps.append((ts2, "RECONCILIATION_RESOLVED", dumps({"outcome": answer})))
                # Asked once; an ambiguous one is asked again two minutes after the first ask.
                due = None if resolved else clock.iso(t0 + 180_000)
                checks = (due, 1, answer, 1)
                if resolved:
                    steps.append(
                        (
                            ts2,
                            "EFFECT_RESOLVED",
                            '{"resolved_by":"reconcile","resolver":"reconcile","state":"committed"}',
                        )
                    )
                    updated, resolved_by, committed_at = ts2, "reconcile", ts2
            for ts, type_, data in steps:
                event_id += 1
                evs.append((event_id, ts, type_, action_id, key, None, data))
            n_amb += ambiguous
            eff.append(
                (
                    key,
                    "ambiguous" if ambiguous else "committed",
                    action_id,
                    1,
                    None,
                    ACTION,
                    action_json,
                    None,
                    None,
                    None,
                    error,
                    resolved_by,
                    ts0,
                    updated,
                    ts0,
                    committed_at,
                    *checks,
                    None,  # lease_holder, lease_steady_until (revision 0019): ended, no lease
                    None,
                    None,  # committed_steady, committed_on (revision 0020): no reading, as
                    None,  # an older writer leaves them
                )
            )
        yield Batch(eff, evs, rcs, (seq, prev), n_amb)


# -- PostgreSQL -----------------------------------------------------------------------------


def copy_to_postgres(sqlite_path: Path, url: str, *, max_seconds: float) -> float:
    """Copy a filled SQLite ledger into the empty PostgreSQL database ``url`` names."""
    import psycopg

    started = time.monotonic()
    PostgresStateStore(url).close()  # the migrations make the schema
    src = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)
    dst = psycopg.connect(_libpq_url(url), connect_timeout=5)
    try:
        with dst.cursor() as cur:
            cur.execute("SET synchronous_commit = off")
            cur.execute("SET maintenance_work_mem = '256MB'")
            cur.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' "
                "AND tablename IN ('effects', 'events', 'receipts') "
                "AND indexname NOT IN (SELECT conname FROM pg_constraint)"
            )
            indexes = cur.fetchall()
            for name, _ in indexes:
                cur.execute(f'DROP INDEX "{name}"')
            for table, cols in COLUMNS.items():
                rows = src.execute(f"SELECT {', '.join(cols)} FROM {table} ORDER BY rowid")
                with cur.copy(f"COPY {table} ({', '.join(cols)}) FROM STDIN") as copy:
                    for i, row in enumerate(rows):
                        copy.write_row(row)
                        if i % 100_000 == 0 and time.monotonic() - started > max_seconds:
                            raise TimeoutError(
                                f"copying to PostgreSQL took over {max_seconds:.0f} s"
                            )
            seq, digest = src.execute("SELECT seq, hash FROM receipt_chain").fetchone()
            cur.execute("UPDATE receipt_chain SET seq = %s, hash = %s WHERE id = 1", (seq, digest))
            cur.execute(
                "SELECT setval(pg_get_serial_sequence('events', 'event_id'), "
                "(SELECT max(event_id) FROM events))"
            )
            for _, sql in indexes:
                cur.execute(sql)
        dst.commit()
        dst.autocommit = True
        dst.execute("ANALYZE")  # what autovacuum would do shortly after such a load
    finally:
        dst.close()
        src.close()
    return time.monotonic() - started


def _libpq_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)
