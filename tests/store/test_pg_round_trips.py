"""On PostgreSQL a protected call's two transactions take few round trips (the key and its
events in one statement; the outcome, its event and the chain's next number in one; the
receipt and the head in one), and leave the same ledger as the statement-by-statement path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from ctrlrun import Control, DuplicateEffect, Policy, Principal, context, protect
from ctrlrun.receipts import verify_chain
from ctrlrun.store import StateStore, open_store

from .conftest import WRITE_POLICY

TYPES = [
    "ACTION_PROPOSED",
    "POLICY_EVALUATED",
    "EFFECT_RESERVED",
    "EXECUTION_STARTED",
    "EXECUTION_COMMITTED",
]


@pytest.fixture
def pg(pg_database: str) -> Iterator[StateStore]:
    s = open_store(pg_database)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def counting(self: Any, query: Any, *args: Any, **kw: Any) -> Any:
        sent.append(str(query).split()[0])
        return execute(self, query, *args, **kw)

    monkeypatch.setattr(psycopg.Cursor, "execute", counting)
    return sent


def test_a_protected_call_is_two_statements_per_transaction(
    pg: StateStore, statements: list[str]
) -> None:
    control = Control(Policy.from_yaml(WRITE_POLICY), pg)
    write = protect("bench.write", effect="w:{n}", control=control)(lambda n: n)
    with context(agent="bench"):
        write(0)  # the freeze table is read once, then cached
        statements.clear()
        assert write(1) == 1
    # BEGIN and COMMIT are the driver's own; these are the statements between them.
    assert statements == ["WITH", "WITH", "WITH"], statements


def test_the_ledger_is_the_same_as_statement_by_statement(pg: StateStore, tmp_path: Any) -> None:
    sqlite = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        for store in (pg, sqlite):
            control = Control(Policy.from_yaml(WRITE_POLICY), store)
            write = protect("bench.write", effect="w:{n}", control=control)(lambda n: n)
            with context(agent="bench"):
                for n in range(3):
                    write(n)
                with pytest.raises(DuplicateEffect):
                    write(1)
        seen = []
        for store in (pg, sqlite):
            with store.reading() as conn:
                events = conn.execute(
                    text("SELECT type, effect_key, data_json FROM events ORDER BY event_id")
                ).all()
                receipts = conn.execute(
                    text("SELECT seq, result, event_pos FROM receipts ORDER BY seq")
                ).all()
                positions = [int(r[0]) for r in conn.execute(text("SELECT event_id FROM events"))]
                effects = conn.execute(
                    text("SELECT effect_key, state, attempt FROM effects ORDER BY effect_key")
                ).all()
                report = verify_chain(conn)
            assert report.ok and report.verified == 4
            # Each receipt points at the last event written before it.
            assert [r[2] for r in receipts] == [sorted(positions)[i] for i in (4, 9, 14, 17)]
            shape = [(t, k, sorted(json.loads(d))) for t, k, d in events]
            seen.append((shape, [tuple(r[:2]) for r in receipts], [tuple(e) for e in effects]))
        assert seen[0] == seen[1]
        events = seen[0][0]
        assert [e[0] for e in events[:5]] == TYPES
        assert [e[0] for e in events[15:]] == [
            "ACTION_PROPOSED",
            "POLICY_EVALUATED",
            "EFFECT_RESERVATION_REFUSED",
        ]
    finally:
        sqlite.close()


def test_a_record_that_moved_while_executing_is_recorded_ambiguous(pg: StateStore) -> None:
    control = Control(Policy.from_yaml(WRITE_POLICY), pg)
    action = control.action("bench.write", {"n": 7}, Principal("bench"))
    attempt = control.begin(action, "w:7")
    with pg.transaction() as conn:  # a contender found the lease expired
        conn.execute(
            text(
                "UPDATE effects SET state = 'ambiguous', lease_expires_at = NULL "
                "WHERE effect_key = 'w:7'"
            )
        )
    receipt = control.finish(attempt, "committed")
    assert receipt.result == "ambiguous"
    assert "record moved" in receipt.error
    with pg.reading() as conn:
        types = [r[0] for r in conn.execute(text("SELECT type FROM events ORDER BY event_id"))]
        assert types[-1] == "EXECUTION_AMBIGUOUS" and "EXECUTION_COMMITTED" not in types
        state = conn.execute(text("SELECT state FROM effects WHERE effect_key = 'w:7'")).scalar()
        assert state == "ambiguous"
        assert verify_chain(conn).ok
