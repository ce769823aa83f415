"""What the CLI shows: the ledger read back as timelines, effects, inspections and counts."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, func, select

from . import ledger
from .approvals import votes
from .checks import Schedule
from .heartbeat import as_seen_here
from .receipts import Receipt, receipt_for_action
from .schema import TIMELINE, events, receipts
from .states import EffectRecord, EffectState


@dataclass(frozen=True)
class TimelineEvent:
    """A reconciliation or resolution event, shown between receipts."""

    event_id: int
    ts: str
    type: str
    action_id: str | None
    effect_key: str | None
    data: dict[str, Any]


def timeline(conn: Connection, last: int | None = None) -> list[Receipt | TimelineEvent]:
    """Receipts and the events that moved records, in the order they were written."""
    r_stmt = select(receipts.c.json, receipts.c.hash, receipts.c.event_pos, receipts.c.seq)
    r_stmt = r_stmt.order_by(receipts.c.seq.desc())
    e_stmt = select(events).where(TIMELINE)
    e_stmt = e_stmt.order_by(events.c.event_id.desc())
    if last is not None:
        r_stmt, e_stmt = r_stmt.limit(last), e_stmt.limit(last)
    items: list[tuple[float, Receipt | TimelineEvent]] = []
    for body, digest, pos, _seq in conn.execute(r_stmt):
        items.append(((pos or 0) + 0.5, Receipt(json.loads(body), digest)))
    for row in conn.execute(e_stmt):
        m = row._mapping
        ev = TimelineEvent(
            m["event_id"],
            m["ts"],
            m["type"],
            m["action_id"],
            m["effect_key"],
            json.loads(m["data_json"]),
        )
        items.append((float(m["event_id"]), ev))
    items.sort(key=lambda pair: pair[0])
    ordered = [item for _, item in items]
    return ordered[-last:] if last is not None else ordered


def receipt_line(r: Receipt) -> str:
    d = r.document
    return "  ".join(
        [
            d["finished_at"],
            d["receipt_id"],
            d["action"],
            f"{d['decision']}/{d['result']}",
            d["effect_key"] or "-",
            d["principal"]["agent"],
        ]
    )


def event_line(e: TimelineEvent) -> str:
    if e.type == "RECONCILIATION_STARTED":
        detail = f"trigger={e.data.get('trigger', '-')}"
    elif e.type == "RECONCILIATION_RESOLVED":
        detail = str(e.data.get("outcome"))
        if e.data.get("evidence"):
            detail += f" ({e.data['evidence']})"
        if e.data.get("reason"):
            detail += f" ({e.data['reason']}: {e.data.get('error', '')})"
    else:
        detail = f"{e.data.get('state')} by {e.data.get('resolver') or e.data.get('resolved_by')}"
        if e.data.get("note"):
            detail += f" ({json.dumps(e.data['note'])})"
    return "  ".join([e.ts, e.type, e.effect_key or "-", detail])


def event_json(e: TimelineEvent) -> dict[str, Any]:
    return {
        "kind": "event",
        "event_id": e.event_id,
        "ts": e.ts,
        "type": e.type,
        "action_id": e.action_id,
        "effect_key": e.effect_key,
        "data": e.data,
    }


def effect_line(rec: EffectRecord, now: Any, schedule: Schedule | None = None) -> str:
    state = rec.state.value
    running = rec.state in (EffectState.RESERVED, EffectState.EXECUTING)
    if running and not as_seen_here(rec, now).lease_is_live(now):
        state += " (lease expired)"
    by = f"  resolved by {rec.resolved_by}" if rec.resolved_by else ""
    from .action import iso

    updated = iso(rec.updated_at)
    line = f"{rec.effect_key}  {state}  attempt {rec.attempt}  {rec.action_id}  {updated}{by}"
    if schedule is not None and rec.state is EffectState.AMBIGUOUS:
        line += "  " + schedule_text(schedule)
    return line


def effect_json(rec: EffectRecord, schedule: Schedule | None = None) -> dict[str, Any]:
    from .action import iso

    found = {
        "effect_key": rec.effect_key,
        "state": rec.state.value,
        "attempt": rec.attempt,
        "action_id": rec.action_id,
        "action": rec.action_name,
        "updated_at": iso(rec.updated_at),
        "error": rec.error,
        "resolved_by": rec.resolved_by,
    }
    if schedule is not None and rec.state is EffectState.AMBIGUOUS:
        due = schedule.next_check_at
        found |= {"checks": schedule.checks, "next_check_at": iso(due) if due else None}
    return found


def schedule_text(schedule: Schedule) -> str:
    """How often the remote was asked about an ambiguous effect, and when it is asked next."""
    from .action import iso

    due = iso(schedule.next_check_at) if schedule.next_check_at else "now"
    return f"asked {schedule.checks} times, next check {due}"


def inspection(conn: Connection, action_id: str) -> dict[str, Any] | None:
    """Everything the ledger knows about one action: receipt, effect, approvals, events."""
    rows = list(
        conn.execute(
            select(events).where(events.c.action_id == action_id).order_by(events.c.event_id)
        )
    )
    receipt = receipt_for_action(conn, action_id)
    if not rows and receipt is None:
        return None
    evs = [
        {
            "event_id": r._mapping["event_id"],
            "ts": r._mapping["ts"],
            "type": r._mapping["type"],
            "effect_key": r._mapping["effect_key"],
            "approval_id": r._mapping["approval_id"],
            "data": json.loads(r._mapping["data_json"]),
        }
        for r in rows
    ]
    key = (
        receipt.document["effect_key"]
        if receipt
        else next((e["effect_key"] for e in evs if e["effect_key"]), None)
    )
    effect = ledger.get_effect_row(conn, key) if key else None
    approval_ids = sorted({e["approval_id"] for e in evs if e["approval_id"]})
    approvals = [
        {**row, "votes": votes(conn, a)}
        for a in approval_ids
        if (row := ledger.approval_row(conn, a)) is not None
    ]
    return {
        "schema": "ctrlrun.inspection/v1",
        "action_id": action_id,
        "receipt": receipt.to_dict() if receipt else None,
        "effect": {k: v for k, v in effect.items() if k != "action_json"} if effect else None,
        "approvals": approvals,
        "events": evs,
    }


def stats(conn: Connection) -> dict[str, Any]:
    by_result: Counter[str] = Counter()
    by_action: Counter[str] = Counter()
    rows = conn.execute(
        select(receipts.c.result, receipts.c.action, func.count()).group_by(
            receipts.c.result, receipts.c.action
        )
    )
    for result, action, n in rows:
        by_result[result] += n
        if action is not None:
            by_action[action] += n
    # A sidecar still on revision 0001 leaves the column NULL: read those names from the documents.
    for (body,) in conn.execute(select(receipts.c.json).where(receipts.c.action.is_(None))):
        by_action[str(_document(body).get("action") or "?")] += 1
    return {
        "schema": "ctrlrun.stats/v1",
        "receipts": sum(by_result.values()),
        "by_result": dict(sorted(by_result.items())),
        "by_action": dict(sorted(by_action.items())),
        "effects": dict(sorted(ledger.count_effects(conn).items())),
    }


def _document(body: str) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
