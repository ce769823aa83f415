"""Admission through the real writer, on SQLite and PostgreSQL, against the independent model.

Each example puts a record and an approval in a ledger exactly as the scenario says, calls
``Control.begin`` (with a lazy reconcile hook when the scenario allows one) and compares
what it raised or returned, the record, the approval, the events and the receipts with
``admission_model.expect`` (composed with the hook's answer for a reconcile-first plan).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from admission_model import (
    AGES,
    DECISIONS,
    EXPIRIES,
    LEASES,
    MODES,
    STATUSES,
    Expect,
    Scenario,
    after_reconcile,
    expect,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from ctrlrun import (
    Action,
    ActionDenied,
    AmbiguousEffect,
    ApprovalMismatch,
    ApprovalRequired,
    Control,
    CTRLRunError,
    DuplicateEffect,
    Policy,
    Principal,
    ledger,
)
from ctrlrun.action import iso, utc_now
from ctrlrun.store import StateStore, open_store

NOW = utc_now().replace(microsecond=0)
LEASE_ENDS = {
    "live": iso(NOW + timedelta(seconds=30)),
    "ends_now": iso(NOW),
    "expired": iso(NOW - timedelta(seconds=1)),
    "none": None,
}
WINDOW = timedelta(minutes=10)
AGE = {"inside": WINDOW - timedelta(seconds=1), "at_window": WINDOW, "past": WINDOW * 2}
EXPIRY = {"future": timedelta(minutes=1), "now": timedelta(0), "past": -timedelta(seconds=1)}
ANSWERS = ("unknown", "committed", "not_executed", "raises")
# Stored records only: nothing ever writes a RESERVED record (see states.py).
STORED = (None, "executing", "committed", "failed", "ambiguous")


def policy(mode: str) -> str:
    lines = ["schema: ctrlrun.policy/v2", f"mode: {mode}", "actions:"]
    for decision in DECISIONS:
        lines.append(f"  {decision}: {{decision: {decision}}}")
        lines.append(f"  {decision}_w: {{decision: {decision}, window: 10m}}")
    return "\n".join(lines) + "\n"


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateStore]:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    if request.param == "postgresql":
        url = request.getfixturevalue("pg_url")
    store = open_store(url)
    yield store
    store.close()


class Bench:
    """One ledger, one Control per mode, and a fresh key and approval id per example."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.controls = {
            mode: Control(Policy.from_yaml(policy(mode)), store, clock=lambda: NOW)
            for mode in MODES
        }
        self.serial = itertools.count()

    def put(self, s: Scenario, key: str, action: Action, approval_id: str) -> None:
        with self.store.transaction() as conn:
            if s.keyed and s.record is not None:
                row = {
                    "effect_key": key,
                    "state": s.record,
                    "action_id": "act_holder",
                    "attempt": s.attempt,
                    "lease_expires_at": LEASE_ENDS[s.lease],
                    "action_name": action.name,
                    "created_at": iso(NOW - timedelta(hours=1)),
                    "updated_at": iso(NOW - AGE[s.age]),
                    "committed_at": iso(NOW - AGE[s.age]) if s.record == "committed" else None,
                }
                names = ", ".join(row)
                marks = ", ".join(f":{c}" for c in row)
                conn.execute(text(f"INSERT INTO effects ({names}) VALUES ({marks})"), row)
            if s.presented and s.status is not None:
                ledger.insert_approval(
                    conn,
                    {
                        "approval_id": approval_id,
                        "action_hash": action.hash if s.same_hash else "sha256:" + "0" * 64,
                        "status": s.status,
                        "action_json": "{}",
                        "approver": "cli:human",
                        "created_at": iso(NOW - timedelta(minutes=1)),
                        "expires_at": iso(NOW + EXPIRY[s.expiry]),
                    },
                )

    def marks(self) -> tuple[int, int]:
        with self.store.reading() as conn:
            events = conn.execute(text("SELECT coalesce(max(event_id), 0) FROM events")).scalar()
            seq = conn.execute(text("SELECT seq FROM receipt_chain")).scalar()
        return int(events or 0), int(seq or 0)

    def run(self, s: Scenario, answer: str) -> Expect:
        n = next(self.serial)
        key, approval_id = f"k:{n}", f"apr_{n:032x}"
        name = s.decision + ("_w" if s.window else "")
        action = Action(name, {"n": n}, Principal("bot"))
        self.put(s, key, action, approval_id)
        events_before, seq_before = self.marks()

        def hook(effect_key: str) -> str:
            if answer == "raises":
                raise ConnectionError("remote unreachable")
            return answer

        control = self.controls[s.mode]
        blocked: str | None = None
        try:
            attempt = control.begin(
                action,
                key if s.keyed else None,
                approval_id=approval_id if s.presented else None,
                reconcile=hook if s.may_reconcile else None,
            )
        except CTRLRunError as exc:
            outcome, request_id = outcome_of(exc), getattr(exc, "request_id", None)
        else:
            outcome = f"reserve:{attempt.attempt}" if attempt.held else "run"
            request_id = None
            blocked = None if attempt.would_have is None else attempt.would_have["blocked_reason"]
        return self.read(key, approval_id, request_id, events_before, seq_before, outcome, blocked)

    def read(
        self,
        key: str,
        approval_id: str,
        request_id: str | None,
        events_before: int,
        seq_before: int,
        outcome: str,
        blocked: str | None,
    ) -> Expect:
        with self.store.reading() as conn:
            rec = ledger.get_effect(conn, key)
            row = ledger.approval_row(conn, request_id or approval_id)
            types = conn.execute(
                text("SELECT type FROM events WHERE event_id > :e ORDER BY event_id"),
                {"e": events_before},
            ).all()
            docs = conn.execute(
                text("SELECT json FROM receipts WHERE seq > :s ORDER BY seq"), {"s": seq_before}
            ).all()
        results = [json.loads(d[0])["result"] for d in docs]
        assert len(results) <= 1, results
        approval = None if row is None else ("new" if request_id else str(row["status"]))
        return Expect(
            outcome,
            tuple(t[0] for t in types),
            results[0] if results else None,
            None if rec is None else (rec.state.value, rec.attempt),
            approval,
            blocked,
        )


def outcome_of(exc: CTRLRunError) -> str:
    if isinstance(exc, DuplicateEffect):
        return "duplicate" if exc.state == "committed" else "in_progress"
    if isinstance(exc, AmbiguousEffect):
        return "ambiguous"
    if isinstance(exc, ApprovalRequired):
        return "approval_required"
    if isinstance(exc, ApprovalMismatch):
        return f"approval_mismatch:{exc.reason}"
    if isinstance(exc, ActionDenied):
        return "approval_denied" if exc.reason == "approval_denied" else "denied"
    raise exc


def expected(s: Scenario, answer: str) -> Expect:
    """The model, with a lazy reconcile in between when the first plan asks for one."""
    first = expect(s)
    if first.outcome != "reconcile_first":
        return first
    settled = "unknown" if answer == "raises" else answer
    second = expect(after_reconcile(s, settled))
    asked = ("RECONCILIATION_STARTED", "RECONCILIATION_RESOLVED")
    moved = ("EFFECT_RESOLVED",) if settled != "unknown" else ()
    events = (*first.events, *asked, *moved, *second.events)
    return Expect(
        second.outcome, events, second.receipt, second.record, second.approval, second.blocked
    )


scenarios = st.builds(
    Scenario,
    decision=st.sampled_from(DECISIONS),
    mode=st.sampled_from(MODES),
    keyed=st.booleans(),
    record=st.sampled_from(STORED),
    lease=st.sampled_from(LEASES),
    attempt=st.integers(1, 3),
    window=st.booleans(),
    age=st.sampled_from(AGES),
    presented=st.booleans(),
    status=st.sampled_from(STATUSES),
    same_hash=st.booleans(),
    expiry=st.sampled_from(EXPIRIES),
    may_reconcile=st.booleans(),
)


@pytest.mark.timeout(600)
def test_admission_on_a_real_ledger_matches_the_model(ledger_store: StateStore) -> None:
    bench = Bench(ledger_store)
    examples = 250 if ledger_store.dialect == "sqlite" else 120

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        database=None,
    )
    @given(scenarios, st.sampled_from(ANSWERS))
    def check(s: Scenario, answer: str) -> None:
        assert bench.run(s, answer) == expected(s, answer), (s, answer)

    check()


def test_every_record_state_on_a_real_ledger(ledger_store: StateStore) -> None:
    """The whole record side, exhaustively, with a lazy hook answering each way."""
    bench = Bench(ledger_store)
    cases: list[tuple[Scenario, str]] = []
    for record, lease, answer in itertools.product(STORED, LEASES, ANSWERS):
        for window, age in [(False, "inside"), (True, "inside"), (True, "at_window")]:
            s = Scenario(record=record, lease=lease, window=window, age=age, may_reconcile=True)
            cases.append((s, answer))
    for s, answer in cases:
        got: Any = bench.run(s, answer)
        assert got == expected(s, answer), (s, answer)
