"""Sending webhook deliveries: one cursor per webhook over the ledger's events.

The events table is the outbox: every event a webhook reports was written in the transaction
that made it, so nothing reported can be lost by a crash, and nothing is reported that did not
happen. Each webhook has a cursor row (``notify_cursors``): the last event delivered, the
sidecar holding the right to send (a lease, so two sidecars never send the same webhook's
events), and, after a failure, when to try again (30 s doubling to 5 min; 1 s at first). A
webhook that is down holds its cursor; once it answers, it gets every event since, in order,
once. A new webhook starts at the ledger's newest event (it is not sent the history), or
just below an id that may still commit (``Horizon.start``).
On PostgreSQL ids are drawn in one order and committed in another: the cursor never passes an
id that a transaction still open may commit (``notify_horizon.py`` says how it knows).

It runs in a thread of its own: a slow or dead receiver never delays a request. A delivery is
sent at least once: a crash between the receiver's 2xx and the cursor's update sends it again,
with the same ``Ctrlrun-Event-Id``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import Connection, text

from ctrlrun.action import iso, new_id
from ctrlrun.store import StateStore

from .notify import EVENTS, Webhook, body_for, document, sign
from .notify_horizon import Horizon, limit_for

log = logging.getLogger(__name__)
BATCH = 20
LEASE = timedelta(seconds=30)
FIRST_RETRY, MAX_RETRY = 1.0, 300.0
_UNSETTLED = ("unknown",)  # a reconciliation that settled nothing is not news


class Notifier:
    """Delivers the events of ``hooks`` from ``store``; ``start()`` runs it in a thread."""

    def __init__(
        self,
        store: StateStore,
        hooks: Sequence[Webhook],
        *,
        interval: float = 0.25,
        timeout: float = 5.0,
        on_failure: Callable[[Webhook], None] | None = None,
        horizon: Horizon | None = None,
    ) -> None:
        self.store, self.hooks, self.interval = store, tuple(hooks), interval
        self.holder = new_id("ntf")
        self.on_failure = on_failure
        self.secrets = {h.target: h.secret() for h in self.hooks}  # a missing one: at start
        self._client = httpx.Client(timeout=timeout, trust_env=False)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing: set[str] = set()
        timeouts = getattr(store, "timeouts", None) or {}  # PostgreSQL's session limits
        self.horizon = horizon or Horizon(limit=limit_for(timeouts))

    def start(self) -> Notifier:
        self._thread = threading.Thread(target=self._run, name="ctrlrun-notify", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                sent = sum(self.deliver(h) for h in self.hooks)
            except Exception as exc:  # a ledger outage: try again later, never stop
                log.warning("notify: cannot read the ledger: %s", exc)
                sent = 0
            if not sent:
                self._stop.wait(self.interval)

    def deliver(self, hook: Webhook) -> int:
        """Send what is due for ``hook`` (at most one batch); returns how many were sent."""
        with self.store.transaction() as conn:
            rows = self._claim(conn, hook)
        if rows is None:
            return 0
        high, events = rows
        sent = 0
        for event in events:
            if not self._send(hook, event):
                return sent
            sent += 1
            with self.store.transaction() as conn:
                _advance(conn, hook.target, self.holder, int(event["event_id"]))
        if len(events) < BATCH:  # everything up to ``high`` that it wants is delivered
            with self.store.transaction() as conn:
                _advance(conn, hook.target, self.holder, high)
        return sent

    def _claim(self, conn: Connection, hook: Webhook) -> tuple[int, list[Mapping[str, Any]]] | None:
        now = self.store.clock()
        high = int(
            conn.execute(text("SELECT COALESCE(MAX(event_id), 0) FROM events")).scalar() or 0
        )
        if not _exists(conn, hook.target):  # a new webhook (or one whose row was removed)
            conn.execute(
                text(
                    "INSERT INTO notify_cursors (target, last_event_id, failures) "
                    "VALUES (:t, :e, 0) ON CONFLICT DO NOTHING"
                ),
                {"t": hook.target, "e": self.horizon.start(conn, high)},
            )
        claimed = conn.execute(
            text(
                "UPDATE notify_cursors SET holder = :me, lease_until = :until WHERE target = :t "
                "AND (holder IS NULL OR holder = :me OR lease_until < :now) "
                "AND (next_at IS NULL OR next_at <= :now) RETURNING last_event_id"
            ),
            {"me": self.holder, "until": iso(now + LEASE), "now": iso(now), "t": hook.target},
        ).first()
        if claimed is None:  # held by another sidecar, or waiting to try again
            return None
        high = self.horizon.safe(conn, hook.target, int(claimed[0]), high)
        types = [str(t) for t, name in EVENTS.items() if name in hook.events]
        found = conn.execute(
            text(
                "SELECT event_id, ts, type, action_id, effect_key, approval_id, data_json "
                "FROM events WHERE event_id > :last AND event_id <= :high "
                f"AND type IN ({', '.join(f':t{i}' for i in range(len(types)))}) "
                "ORDER BY event_id LIMIT :n"
            ),
            {
                "last": claimed[0],
                "high": high,
                "n": BATCH,
                **{f"t{i}": t for i, t in enumerate(types)},
            },
        )
        events = [dict(r._mapping) for r in found]
        return high, [{**e, "details": _details(conn, e)} for e in events if _news(e)]

    def _send(self, hook: Webhook, event: Mapping[str, Any]) -> bool:
        doc = document(event, EVENTS[event["type"]], event["details"])
        body = body_for(hook, doc)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "ctrlrun-notify",
            "Ctrlrun-Event-Id": doc["id"],
            "Ctrlrun-Signature": sign(self.secrets[hook.target], body, int(time.time())),
        }
        try:
            r = self._client.post(hook.url, content=body, headers=headers)
            ok, why = r.is_success, f"answered {r.status_code}"
        except httpx.HTTPError as exc:
            ok, why = False, f"{type(exc).__name__}"
        if ok:
            if hook.target in self._failing:
                self._failing.discard(hook.target)
                log.info("notify: %s answers again", hook.shown)
            return True
        self._failed(hook, why)
        return False

    def _failed(self, hook: Webhook, why: str) -> None:
        if self.on_failure is not None:
            self.on_failure(hook)
        if hook.target not in self._failing:  # one line per change of state, not per try
            self._failing.add(hook.target)
            log.warning("notify: %s %s; retrying with backoff", hook.shown, why)
        with self.store.transaction() as conn:
            now = self.store.clock()
            failures = int(
                conn.execute(
                    text("SELECT failures FROM notify_cursors WHERE target = :t"),
                    {"t": hook.target},
                ).scalar()
                or 0
            )
            wait = min(MAX_RETRY, FIRST_RETRY * 2**failures)
            conn.execute(
                text(
                    "UPDATE notify_cursors SET failures = failures + 1, next_at = :next, "
                    "last_error = :why WHERE target = :t AND holder = :me"
                ),
                {
                    "next": iso(now + timedelta(seconds=wait)),
                    "why": why,
                    "t": hook.target,
                    "me": self.holder,
                },
            )


def _advance(conn: Connection, target: str, holder: str, event_id: int) -> None:
    conn.execute(
        text(
            "UPDATE notify_cursors SET last_event_id = :e, failures = 0, next_at = NULL, "
            "last_error = NULL WHERE target = :t AND holder = :me AND last_event_id < :e"
        ),
        {"e": event_id, "t": target, "me": holder},
    )


def _news(event: Mapping[str, Any]) -> bool:
    if event["type"] != "RECONCILIATION_RESOLVED":
        return True
    return json.loads(event["data_json"] or "{}").get("outcome") not in _UNSETTLED


def _details(conn: Connection, event: Mapping[str, Any]) -> dict[str, Any]:
    """What the ledger knows about the event's action: its name, arguments and agent."""
    if event["approval_id"]:
        row = conn.execute(
            text("SELECT action_json, expires_at, approver FROM approvals WHERE approval_id = :a"),
            {"a": event["approval_id"]},
        ).first()
    elif event["effect_key"]:
        row = conn.execute(
            text("SELECT action_json, state FROM effects WHERE effect_key = :k"),
            {"k": event["effect_key"]},
        ).first()
    else:
        return {}
    if row is None:
        return {}
    found = dict(row._mapping)
    action = json.loads(found.pop("action_json") or "{}")
    principal = action.get("principal") or {}
    return {
        "action": action.get("name"),
        "arguments": action.get("arguments", {}),
        "agent": principal.get("agent"),
        **{k: v for k, v in found.items() if v is not None},
    }


def _exists(conn: Connection, target: str) -> bool:
    found = conn.execute(text("SELECT 1 FROM notify_cursors WHERE target = :t"), {"t": target})
    return found.first() is not None
