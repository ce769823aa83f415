"""Row-level ledger operations. Each takes an open connection; the caller owns the transaction.

Every later transition of an effect is a compare-and-set on (key, state, action_id, attempt)
whose row count is checked, so the same code is correct on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, func, insert, select, update

from . import steady
from .action import parse_iso
from .errors import OutcomeUnknown, StoreError
from .events import EventType
from .schema import GENESIS_HASH, approval_votes, approvals, receipt_chain
from .schema import effects as E
from .states import LEASE_EXPIRED, LEASE_RAN_OUT, EffectRecord, EffectState, check_transition
from .timestamps import stamp

# The statements every decision runs are plain SQL on the driver's connection, inside the
# caller's SQLAlchemy transaction: through Core each costs about 25 µs of Python on top of the
# 10 µs the database needs, and a decision runs ten of them. The SQL is the same on both
# engines (ON CONFLICT DO NOTHING and RETURNING need SQLite >= 3.35); only the parameter
# style differs. Everything else in the kernel uses SQLAlchemy Core.
_EFFECT_COLUMNS = tuple(c.name for c in E.columns)
_EVENT_COLUMNS = ("ts", "type", "action_id", "effect_key", "approval_id", "data_json")
_EVENT_INSERT = (
    f"INSERT INTO events ({', '.join(_EVENT_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c for c in _EVENT_COLUMNS)})"
)
_HOT = {
    "get_effect": f"SELECT {', '.join(_EFFECT_COLUMNS)} FROM effects WHERE effect_key = :key",
    "insert_event": _EVENT_INSERT,
    "insert_event_id": _EVENT_INSERT + " RETURNING event_id",
    "last_event": "SELECT max(event_id) FROM events",
    "advance_chain": "UPDATE receipt_chain SET seq = seq + 1 WHERE id = 1 RETURNING seq, hash",
    "insert_receipt": (
        "INSERT INTO receipts (receipt_id, action_id, effect_key, result, json, ts, seq, "
        "prev_hash, hash, event_pos, action) VALUES (:receipt_id, :action_id, :effect_key, "
        ":result, :json, :ts, :seq, :prev_hash, :hash, :event_pos, :action)"
    ),
    "set_head": "UPDATE receipt_chain SET hash = :hash WHERE id = 1",
}
# PostgreSQL: the receipt and the new head in one statement, one round trip (a data-modifying
# WITH; SQLite has none, and a statement there costs no round trip).
_HOT["receipt_and_head"] = (
    "WITH r AS (" + _HOT["insert_receipt"] + " RETURNING hash) "
    "UPDATE receipt_chain SET hash = (SELECT hash FROM r) WHERE id = 1"
)
_PARAM = re.compile(r":(\w+)")


@functools.cache
def _sql(dialect: str, text_: str) -> str:
    if dialect == "postgresql":
        return _PARAM.sub(r"%(\1)s", text_)
    if dialect == "sqlite":
        return text_
    raise StoreError(f"unsupported database {dialect}")  # pragma: no cover


def _run(conn: Connection, name_or_sql: str, params: Any = None) -> Any:
    """Execute one hot statement on the driver connection; returns the driver's cursor.

    A driver error raised here is the driver's own (``sqlite3.Error``, ``psycopg.Error``):
    the store's transaction maps it to ``StoreError`` (``driver_errors``).
    """
    raw: Any = conn.connection.dbapi_connection
    sql = _sql(conn.dialect.name, _HOT.get(name_or_sql, name_or_sql))
    cur = raw.cursor()
    cur.execute(sql, params or {})
    return cur


def _run_committing(conn: Connection, name: str, params: Mapping[str, Any]) -> None:
    """PostgreSQL: a hot statement and then ``COMMIT``, in one round trip (one simple query,
    its parameters bound on this side); the caller's commit then finds nothing left to do.
    A connection lost on the way may have committed: ``OutcomeUnknown``, never run again."""
    raw: Any = conn.connection.dbapi_connection
    client = sys.modules["psycopg"].ClientCursor  # loaded: this is a psycopg connection
    try:
        client(raw).execute(_sql("postgresql", _HOT[name]) + "; COMMIT", params)
    except Exception as exc:
        if raw.broken or raw.closed:
            raise OutcomeUnknown(f"the connection was lost with the COMMIT sent: {exc}") from exc
        raise


@functools.cache
def _insert_effect_sql(columns: tuple[str, ...]) -> str:
    names = ", ".join(columns)
    values = ", ".join(f":{c}" for c in columns)
    return f"INSERT INTO effects ({names}) VALUES ({values}) ON CONFLICT DO NOTHING"


@functools.cache
def _move_effect_sql(columns: tuple[str, ...]) -> str:
    sets = ", ".join(f"{c} = :{c}" for c in columns)
    return (
        f"UPDATE effects SET {sets} WHERE effect_key = :k_key AND state = :k_old "
        "AND action_id = :k_action_id AND attempt = :k_attempt"
    )


def _ts(value: str | None) -> datetime | None:
    return None if value is None else parse_iso(value)


def to_record(row: Row[Any]) -> EffectRecord:
    return _record(dict(row._mapping))


def _record(m: Mapping[str, Any]) -> EffectRecord:
    return EffectRecord(
        effect_key=m["effect_key"],
        state=EffectState(m["state"]),
        action_id=m["action_id"],
        attempt=m["attempt"],
        lease_expires_at=_ts(m["lease_expires_at"]),
        created_at=parse_iso(m["created_at"]),
        updated_at=parse_iso(m["updated_at"]),
        committed_at=_ts(m["committed_at"]),
        action_name=m["action_name"],
        result=m["result_json"],
        error=m["error"],
        resolved_by=m["resolved_by"],
        idempotency_key=m["idempotency_key"],
        holder=m["lease_holder"],
        lease_steady_until=m["lease_steady_until"],
        committed_steady=m["committed_steady"],
        committed_on=m["committed_on"],
    )


def get_effect(conn: Connection, key: str) -> EffectRecord | None:
    row = get_effect_row(conn, key)
    return None if row is None else _record(row)


def get_effect_row(conn: Connection, key: str) -> Mapping[str, Any] | None:
    found = _run(conn, "get_effect", {"key": key}).fetchone()
    return None if found is None else dict(zip(_EFFECT_COLUMNS, found, strict=True))


def insert_effect(conn: Connection, values: Mapping[str, Any]) -> bool:
    """Insert a new record; False when the key already exists (someone else won)."""
    check_transition(EffectState.NEW, EffectState(values["state"]))
    sql = _insert_effect_sql(tuple(values))  # a plan names its columns in one order
    taken = int(_run(conn, sql, values).rowcount) == 1
    return taken and steady.written(values["effect_key"], 1, values)


def move_effect(
    conn: Connection,
    key: str,
    *,
    old: EffectState,
    new: EffectState,
    action_id: str,
    attempt: int,
    values: Mapping[str, Any],
) -> bool:
    """Compare-and-set one transition; False when the record is no longer as expected."""
    check_transition(old, new)
    params = {**values, "state": new.value}
    sql = _move_effect_sql(tuple(params))
    params.update(k_key=key, k_old=old.value, k_action_id=action_id, k_attempt=attempt)
    moved = int(_run(conn, sql, params).rowcount) == 1
    return moved and steady.written(key, attempt, values, new is EffectState.AMBIGUOUS)


def expire_lease(conn: Connection, record: EffectRecord, now: datetime) -> bool:
    """Move a record whose holder's lease ran out to AMBIGUOUS, with its event (False: it
    moved under us, another contender got there first)."""
    if not move_effect(
        conn,
        record.effect_key,
        old=record.state,
        new=EffectState.AMBIGUOUS,
        action_id=record.action_id,
        attempt=record.attempt,
        values={"updated_at": stamp(now), **LEASE_RAN_OUT},
    ):
        return False
    append_event(
        conn,
        now,
        EventType.EXECUTION_AMBIGUOUS,
        action_id=record.action_id,
        effect_key=record.effect_key,
        data={"error": LEASE_EXPIRED},
    )
    return True


def list_effects(
    conn: Connection, state: EffectState | None = None, limit: int | None = None
) -> list[EffectRecord]:
    stmt = select(E)
    if state is not None:
        stmt = stmt.where(E.c.state == state.value)
    stmt = stmt.order_by(E.c.updated_at.desc())
    if limit is not None:
        stmt = stmt.limit(limit)
    return [to_record(r) for r in conn.execute(stmt)]


def count_effects(conn: Connection) -> dict[str, int]:
    rows = conn.execute(select(E.c.state, func.count()).group_by(E.c.state))
    return {str(state): int(n) for state, n in rows}


def append_event(
    conn: Connection,
    now: datetime,
    type_: EventType,
    *,
    action_id: str | None = None,
    effect_key: str | None = None,
    approval_id: str | None = None,
    data: Mapping[str, Any] | None = None,
) -> int:
    """Append one event; returns its id."""
    row = event_row(now, type_, action_id, effect_key, approval_id, data)
    if conn.dialect.name == "sqlite":  # the event id is the rowid: no RETURNING needed
        return int(_run(conn, "insert_event", row).lastrowid)
    return int(_run(conn, "insert_event_id", row).fetchone()[0])


def append_events(
    conn: Connection, rows: Sequence[Mapping[str, Any]], *, returning: bool = False
) -> int | None:
    """Append several events in one multi-row ``INSERT`` (rows as ``event_row`` builds them).

    ``returning=True``: the id of the last one comes back, for a receipt written next.
    """
    if not rows:
        return None
    params = {name: rows[i][c] for name, i, c in _event_params(len(rows))}
    if returning and conn.dialect.name == "sqlite":  # the last row's rowid is the largest id
        return int(_run(conn, _events_sql(len(rows), False), params).lastrowid)
    cur = _run(conn, _events_sql(len(rows), returning), params)
    return max(int(r[0]) for r in cur.fetchall()) if returning else None


@functools.cache
def _event_params(n: int) -> tuple[tuple[str, int, str], ...]:
    """(parameter, row, column) of ``_events_sql(n)``'s parameters."""
    return tuple((f"{c}_{i}", i, c) for i in range(n) for c in _EVENT_COLUMNS)


@functools.cache
def _events_sql(n: int, returning: bool) -> str:
    values = ", ".join("(" + ", ".join(f":{c}_{i}" for c in _EVENT_COLUMNS) + ")" for i in range(n))
    sql = f"INSERT INTO events ({', '.join(_EVENT_COLUMNS)}) VALUES {values}"
    return sql + " RETURNING event_id" if returning else sql


def event_row(
    now: datetime,
    type_: EventType,
    action_id: str | None = None,
    effect_key: str | None = None,
    approval_id: str | None = None,
    data: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "ts": stamp(now),
        "type": type_.value,
        "action_id": action_id,
        "effect_key": effect_key,
        "approval_id": approval_id,
        "data_json": _event_json(data if type(data) is dict else dict(data)) if data else "{}",
    }


# ``json.dumps`` with options builds an encoder per call; this one is built once.
_event_json = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode


def advance_chain(conn: Connection) -> tuple[int, str]:
    """Take the next receipt sequence number; returns (seq, previous hash). Locks the head."""
    seq, digest = _run(conn, "advance_chain").fetchone()
    return int(seq), str(digest)


def store_receipt(
    conn: Connection,
    doc: Mapping[str, Any],
    body: str,
    digest: str,
    event_pos: int | None = None,
    *,
    commit: bool = False,
) -> None:
    """``commit``: the transaction's last write; on PostgreSQL its COMMIT goes with it."""
    if event_pos is None:
        event_pos = _run(conn, "last_event").fetchone()[0]
    pg = conn.dialect.name == "postgresql"
    (_run_committing if pg and commit else _run)(
        conn,
        "receipt_and_head" if pg else "insert_receipt",
        {
            "receipt_id": doc["receipt_id"],
            "action_id": doc["action_id"],
            "effect_key": doc["effect_key"],
            "result": doc["result"],
            "json": body,
            "ts": doc["finished_at"],
            "seq": doc["seq"],
            "prev_hash": doc["prev_hash"],
            "hash": digest,
            "event_pos": event_pos,
            "action": doc["action"],
        },
    )
    if not pg:
        _run(conn, "set_head", {"hash": digest})


def chain_head(conn: Connection) -> tuple[int, str]:
    row = conn.execute(select(receipt_chain.c.seq, receipt_chain.c.hash)).first()
    return (0, GENESIS_HASH) if row is None else (int(row[0]), str(row[1]))


def approval_row(conn: Connection, approval_id: str) -> Mapping[str, Any] | None:
    row = conn.execute(select(approvals).where(approvals.c.approval_id == approval_id)).first()
    return None if row is None else dict(row._mapping)


def granted_approval(conn: Connection, action_hash: str, now: str) -> Mapping[str, Any] | None:
    """The oldest granted, unexpired approval for ``action_hash`` (``now`` in ISO form)."""
    row = _oldest_approval(conn, "granted", action_hash, now, approvals.c.granted_at)
    return None if row is None else dict(row._mapping)


def pending_request(conn: Connection, action_hash: str, now: str) -> str | None:
    """The oldest pending, unexpired request for ``action_hash`` (``now`` in ISO form)."""
    row = _oldest_approval(conn, "pending", action_hash, now, approvals.c.created_at)
    return None if row is None else str(row.approval_id)


def _oldest_approval(conn: Connection, status: str, action_hash: str, now: str, since: Any) -> Any:
    stmt = (
        select(approvals)
        .where(
            approvals.c.status == status,
            approvals.c.action_hash == action_hash,
            approvals.c.expires_at > now,
        )
        .order_by(since, approvals.c.approval_id)
        .limit(1)
    )
    return conn.execute(stmt).first()


def insert_approval(conn: Connection, values: Mapping[str, Any]) -> None:
    conn.execute(insert(approvals).values(**values))


def move_approval(
    conn: Connection, approval_id: str, *, old: str, new: str, values: Mapping[str, Any]
) -> bool:
    stmt = (
        update(approvals)
        .where(approvals.c.approval_id == approval_id, approvals.c.status == old)
        .values(status=new, **values)
    )
    return conn.execute(stmt).rowcount == 1


def pending_approvals(conn: Connection) -> list[Mapping[str, Any]]:
    """Pending requests, oldest first, each with ``approvers``: who approved it so far (a
    quorum short of its number), in order."""
    stmt = select(approvals).where(approvals.c.status == "pending").order_by(approvals.c.created_at)
    rows = [dict(r._mapping) for r in conn.execute(stmt)]
    votes = (
        select(approval_votes.c.approval_id, approval_votes.c.operator)
        .join(approvals, approvals.c.approval_id == approval_votes.c.approval_id)
        .where(approvals.c.status == "pending", approval_votes.c.decision == "grant")
        .order_by(approval_votes.c.at, approval_votes.c.operator)
    )
    given: dict[str, list[str]] = {}
    for approval_id, operator in conn.execute(votes):
        given.setdefault(approval_id, []).append(operator)
    return [{**row, "approvers": given.get(row["approval_id"], [])} for row in rows]


def decode(text_: str | None) -> Any:
    return None if text_ is None else json.loads(text_)
