"""Helpers for the sweep tests: ambiguous records as the proxy leaves them, and remotes."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, select

from ctrlrun.action import iso, utc_now
from ctrlrun.reconcile import ReconcileOutcome
from ctrlrun.reconcilers.base import EffectFacts
from ctrlrun.schema import effects, events
from ctrlrun.store import StateStore

POLICY = "schema: ctrlrun.policy/v2\nactions:\n  k8s.scale:\n    decision: allow\n"


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        now = utc_now()  # whole milliseconds, as the ledger writes times
        self.now = now.replace(microsecond=now.microsecond // 1000 * 1000)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def stuck(
    store: StateStore, n: int, now: datetime, upstream: str = "kube", prefix: str = "web"
) -> list[str]:
    """``n`` AMBIGUOUS records as the proxy leaves them, a minute apart; the first is oldest."""
    keys = [f"scale:eu:{prefix}{i:03d}:6" for i in range(n)]
    rows = []
    for i, key in enumerate(keys):
        when = iso(now - timedelta(minutes=n - i))
        name = f"{prefix}{i:03d}"
        action = {"name": "k8s.scale", "arguments": {"deployment": name, "replicas": 6}}
        rows.append(
            {
                "effect_key": key,
                "state": "ambiguous",
                "action_id": f"act_{prefix}{i:029x}"[:36],
                "attempt": 1,
                "action_name": "k8s.scale",
                "action_json": json.dumps(action),
                "upstream": upstream,
                "error": "reply lost",
                "created_at": when,
                "updated_at": when,
                "attempt_started_at": when,
            }
        )
    with store.transaction() as conn:
        conn.execute(insert(effects), rows)
    return keys


def event_count(store: StateStore) -> int:
    with store.reading() as conn:
        return int(conn.execute(select(func.count()).select_from(events)).scalar_one())


def events_of(store: StateStore, key: str) -> list[tuple[str, dict[str, Any]]]:
    """(type, data) of the events about ``key``, in order."""
    with store.reading() as conn:
        rows = conn.execute(
            select(events.c.type, events.c.data_json)
            .where(events.c.effect_key == key)
            .order_by(events.c.event_id)
        ).all()
    return [(t, json.loads(d)) for t, d in rows]


def record(store: StateStore, key: str) -> dict[str, Any]:
    with store.reading() as conn:
        row = conn.execute(select(effects).where(effects.c.effect_key == key)).one()
    return dict(row._mapping)


class Remote:
    """A reconciler whose answers the test sets; counts who it was asked about."""

    def __init__(self, answer: ReconcileOutcome | Callable[[EffectFacts], Any] = "unknown"):
        self.answer = answer
        self.asked: Counter[str] = Counter()

    def __call__(self, facts: EffectFacts) -> ReconcileOutcome:
        self.asked[facts.effect_key] += 1
        if callable(self.answer):
            result: ReconcileOutcome = self.answer(facts)
            return result
        return self.answer
