"""The ledger's hot path: how many statements a protected call costs, and which.

SQLite's trace callback sees every statement the database runs (each row of an
``executemany`` counts once), so these are the statements a decision really costs. The
budgets are what the kernel spent before admission became a plan, or fewer: a new key is
taken by inserting first (no read), and a refusal's events go in one statement.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import event

from ctrlrun import (
    ActionDenied,
    Control,
    DuplicateEffect,
    Policy,
    SQLiteStateStore,
    context,
    ledger,
    protect,
)
from ctrlrun.action import utc_now
from ctrlrun.events import EventType

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  write: {effect: "w:{n}", decision: allow}
  deny: {decision: deny}
"""


@pytest.fixture
def traced(store: SQLiteStateStore) -> list[str]:
    statements: list[str] = []

    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.set_trace_callback(lambda sql: statements.append(" ".join(sql.split()[:3])))

    event.listen(store.engine, "connect", on_connect)
    store.engine.dispose()  # every connection from now on is traced
    return statements


def run_traced(statements: list[str], call: Callable[[], Any]) -> list[str]:
    statements.clear()
    with contextlib.suppress(DuplicateEffect, ActionDenied):
        call()
    return list(statements)


@pytest.mark.parametrize(
    ("what", "budget"),
    [("allowed_new_key", 11), ("duplicate", 8), ("denied", 6)],
)
def test_statements_per_call(
    store: SQLiteStateStore, traced: list[str], what: str, budget: int
) -> None:
    control = Control(Policy.from_yaml(POLICY), store)

    @protect("write", control=control)
    def write(n: int) -> None:
        pass

    @protect("deny", control=control)
    def deny() -> None:
        pass

    with context("bot"):
        write(0)  # warm: the first call opens the connection
        call = {
            "allowed_new_key": lambda: write(1),
            "duplicate": lambda: write(0),
            "denied": deny,
        }[what]
        ran = run_traced(traced, call)
    print(f"{what}: {len(ran)} statements: {ran}")
    assert len(ran) <= budget, ran
    if what == "allowed_new_key":
        # Insert first, read only on conflict: a new key is never read before it is taken.
        assert not any(s.startswith("SELECT") for s in ran), ran
        assert ran[:2] == ["BEGIN IMMEDIATE", "INSERT INTO effects"]


def test_append_events_returns_the_last_id(store: SQLiteStateStore) -> None:
    now = utc_now()
    rows = [ledger.event_row(now, t, "act_1") for t in list(EventType)[:3]]
    with store.transaction() as conn:
        first = ledger.append_events(conn, rows[:1], returning=True)
        assert ledger.append_events(conn, rows) is None
        last = ledger.append_events(conn, rows, returning=True)
    assert first is not None and last == first + 6
