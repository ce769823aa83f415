"""Row-level ledger operations. Each takes an open connection; the caller owns the transaction.

Every later transition of an effect is a compare-and-set on (key, state, action_id, attempt)
whose row count is checked, so the same code is correct on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, bindparam, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite

from .action import iso, parse_iso
from .errors import StoreError
from .events import EventType
from .schema import GENESIS_HASH, approvals, events, receipt_chain, receipts
from .schema import effects as E
from .states import EffectRecord, EffectState, check_transition

# Statements built once: building one per call (``.values(...)``) costs ten times executing it.
_GET_EFFECT = select(E).where(E.c.effect_key == bindparam("_key"))
# The row count of an INSERT is how a reservation knows it won; SQLAlchemy drops it for
# INSERTs unless asked to keep it.
_INSERT_EFFECT = {
    "postgresql": postgresql.insert(E)
    .on_conflict_do_nothing()
    .execution_options(preserve_rowcount=True),
    "sqlite": sqlite.insert(E).on_conflict_do_nothing().execution_options(preserve_rowcount=True),
}
_MOVE_EFFECT = update(E).where(
    E.c.effect_key == bindparam("_key"),
    E.c.state == bindparam("_old"),
    E.c.action_id == bindparam("_action_id"),
    E.c.attempt == bindparam("_attempt"),
)
_INSERT_EVENT = insert(events)
_ADVANCE_CHAIN = (
    update(receipt_chain)
    .where(receipt_chain.c.id == 1)
    .values(seq=receipt_chain.c.seq + 1)
    .returning(receipt_chain.c.seq, receipt_chain.c.hash)
)
_INSERT_RECEIPT = insert(receipts)
_SET_HEAD = update(receipt_chain).where(receipt_chain.c.id == 1).values(hash=bindparam("_hash"))
_LAST_EVENT = select(func.max(events.c.event_id))


def _ts(value: str | None) -> datetime | None:
    return None if value is None else parse_iso(value)


def to_record(row: Row[Any]) -> EffectRecord:
    m = row._mapping
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
    )


def get_effect(conn: Connection, key: str) -> EffectRecord | None:
    row = conn.execute(_GET_EFFECT, {"_key": key}).first()
    return None if row is None else to_record(row)


def get_effect_row(conn: Connection, key: str) -> Mapping[str, Any] | None:
    row = conn.execute(_GET_EFFECT, {"_key": key}).first()
    return None if row is None else dict(row._mapping)


def insert_effect(conn: Connection, values: Mapping[str, Any]) -> bool:
    """Insert a new record; False when the key already exists (someone else won)."""
    check_transition(EffectState.NEW, EffectState.RESERVED)
    stmt = _INSERT_EFFECT.get(conn.dialect.name)
    if stmt is None:  # pragma: no cover - only the two engines above are supported
        raise StoreError(f"unsupported database {conn.dialect.name}")
    return conn.execute(stmt, dict(values)).rowcount == 1


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
    params = {
        **values,
        "state": new.value,
        "_key": key,
        "_old": old.value,
        "_action_id": action_id,
        "_attempt": attempt,
    }
    return conn.execute(_MOVE_EFFECT, params).rowcount == 1


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
    key = conn.execute(_INSERT_EVENT, row).inserted_primary_key
    assert key is not None
    return int(key[0])


def append_events(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """Append several events in one statement (rows as ``event_row`` builds them)."""
    if rows:
        conn.execute(_INSERT_EVENT, [dict(r) for r in rows])


def event_row(
    now: datetime,
    type_: EventType,
    action_id: str | None = None,
    effect_key: str | None = None,
    approval_id: str | None = None,
    data: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "ts": iso(now),
        "type": type_.value,
        "action_id": action_id,
        "effect_key": effect_key,
        "approval_id": approval_id,
        "data_json": json.dumps(dict(data or {}), sort_keys=True, separators=(",", ":")),
    }


def advance_chain(conn: Connection) -> tuple[int, str]:
    """Take the next receipt sequence number; returns (seq, previous hash). Locks the head."""
    row = conn.execute(_ADVANCE_CHAIN).one()
    return int(row[0]), str(row[1])


def store_receipt(
    conn: Connection, doc: Mapping[str, Any], body: str, digest: str, event_pos: int | None = None
) -> None:
    if event_pos is None:
        event_pos = conn.execute(_LAST_EVENT).scalar()
    conn.execute(
        _INSERT_RECEIPT,
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
    conn.execute(_SET_HEAD, {"_hash": digest})


def chain_head(conn: Connection) -> tuple[int, str]:
    row = conn.execute(select(receipt_chain.c.seq, receipt_chain.c.hash)).first()
    return (0, GENESIS_HASH) if row is None else (int(row[0]), str(row[1]))


def approval_row(conn: Connection, approval_id: str) -> Mapping[str, Any] | None:
    row = conn.execute(select(approvals).where(approvals.c.approval_id == approval_id)).first()
    return None if row is None else dict(row._mapping)


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
    stmt = select(approvals).where(approvals.c.status == "pending").order_by(approvals.c.created_at)
    return [dict(r._mapping) for r in conn.execute(stmt)]


def decode(text_: str | None) -> Any:
    return None if text_ is None else json.loads(text_)
