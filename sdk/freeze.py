"""The kill switch: frozen scopes that every process on the ledger refuses to act on.

A freeze is a row in ``freezes``: the scope (an action name, or ``*`` for every action), why,
who, when. Admission reads it (``active``) in the reservation's own transaction, so a write
that is admitted was not frozen when it was admitted. Each process keeps what it read for at
most ``TTL`` so the hot path does not pay a query per decision; a freeze therefore reaches
every sidecar and SDK process within ``TTL`` (the promise is one second; ``TTL`` is half).
Freezing and lifting are operator acts: each writes a receipt (``operator_receipt``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, insert, select

from .action import Action, canonical_bytes, iso, new_id, sha256
from .attempt import Attempt, attempt_receipt
from .errors import ActionFrozen, InvalidArgument
from .events import EventType
from .ledger import append_event
from .receipts import Receipt, write_receipt
from .schema import freezes

ALL = "*"
TTL = 0.5  # seconds a process may act on what it last read of the switch


@dataclass(frozen=True)
class Freeze:
    """One frozen scope."""

    scope: str
    reason: str
    frozen_by: str
    frozen_at: str

    @property
    def message(self) -> str:
        what = "every action" if self.scope == ALL else self.scope
        return f"{what} is frozen by {self.frozen_by}: {self.reason}"


class FreezeCache:
    """What one process last read of the switch, for at most ``TTL`` seconds."""

    def __init__(self, ttl: float = TTL) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._read_at = -1e18
        self._rows: dict[str, Freeze] = {}

    def active(self, conn: Connection, name: str) -> Freeze | None:
        """The freeze that covers action ``name``, reading the table when ours is stale."""
        now = time.monotonic()
        with self._lock:
            if now - self._read_at >= self.ttl:
                self._rows = {f.scope: f for f in list_freezes(conn)}
                self._read_at = now
            rows = self._rows
        return rows.get(ALL) or rows.get(name)

    def forget(self) -> None:
        with self._lock:
            self._read_at = -1e18


def refuse_if_frozen(
    conn: Connection, cache: FreezeCache, action: Action, now: datetime, policy_hash: str
) -> ActionFrozen | None:
    """For a write that no admission decides (``unmapped_writes: allow``): when its action is
    frozen, record the refusal (event and blocked receipt) and return the error to raise."""
    frozen = cache.active(conn, action.name)
    if frozen is None:
        return None
    data = {"reason": "frozen", "detail": frozen.message}
    append_event(conn, now, EventType.ACTION_DENIED, action_id=action.action_id, data=data)
    attempt = Attempt(action, None, 0, "deny", "frozen", policy_hash, now)
    receipt = attempt_receipt(conn, attempt, "blocked", None, now, error=frozen.message)
    return ActionFrozen(frozen.message, action_id=action.action_id, receipt_id=receipt.receipt_id)


def list_freezes(conn: Connection) -> list[Freeze]:
    rows = conn.execute(select(freezes).order_by(freezes.c.scope))
    return [Freeze(**dict(r._mapping)) for r in rows]


def freeze(
    conn: Connection, scope: str, *, reason: str, by: str, now: datetime
) -> tuple[Freeze, Receipt]:
    """Freeze ``scope`` (replacing an earlier freeze of it); a receipt records the act."""
    if not reason.strip():
        raise InvalidArgument("a freeze needs a reason (--reason TEXT)")
    row = Freeze(scope, reason.strip(), by, iso(now))
    conn.execute(delete(freezes).where(freezes.c.scope == scope))
    conn.execute(insert(freezes).values(**row.__dict__))
    data = {"scope": scope, "reason": row.reason, "by": by}
    append_event(conn, now, EventType.LEDGER_FROZEN, data=data)
    arguments = {"scope": scope, "reason": row.reason}
    return row, operator_receipt(conn, "ctrlrun.freeze", arguments, by, now)


def unfreeze(conn: Connection, scope: str, *, by: str, now: datetime) -> Receipt | None:
    """Lift the freeze of ``scope``; None when it was not frozen (nothing is recorded)."""
    if conn.execute(delete(freezes).where(freezes.c.scope == scope)).rowcount == 0:
        return None
    append_event(conn, now, EventType.LEDGER_UNFROZEN, data={"scope": scope, "by": by})
    return operator_receipt(conn, "ctrlrun.unfreeze", {"scope": scope}, by, now)


def operator_receipt(
    conn: Connection, name: str, arguments: Mapping[str, Any], by: str, now: datetime
) -> Receipt:
    """The receipt of an operator's own act (not an agent's action): committed, by ``by``."""
    document = {"name": name, "arguments": dict(arguments), "operator": by}
    return write_receipt(
        conn,
        {
            "action_id": new_id("act"),
            "action": name,
            "action_hash": sha256(canonical_bytes(document)),
            "arguments": dict(arguments),
            "principal": {"agent": f"operator:{by}", "user": by},
            "resource": None,
            "environment": None,
            "decision": "allow",
            "decision_reason": "operator",
            "approval_id": None,
            "approver": by,
            "effect_key": None,
            "attempt": None,
            "result": "committed",
            "error": None,
            "policy_hash": None,
            "started_at": iso(now),
            "finished_at": iso(now),
        },
    )
