"""On PostgreSQL a protected call takes four round trips (the key and its events: one
statement, its own transaction; the outcome, its event and the chain's next number in one
after BEGIN; the receipt and the head with the COMMIT), and leaves the same ledger as the
statement-by-statement path."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg import pq
from sqlalchemy import event, text

from ctrlrun import Control, DuplicateEffect, Policy, Principal, context, protect
from ctrlrun.errors import OutcomeUnknown
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
def round_trips(pg: StateStore, tmp_path: Path) -> Iterator[Callable[[], list[list[str]]]]:
    """What the store's connections send, one list per round trip (each ends at the server's
    ReadyForQuery), each message as its statement's first word (``+COMMIT``: and a COMMIT in
    the same query), from libpq's own trace of the wire."""
    log = (tmp_path / "pq.trace").open("w")
    traced: list[Any] = []

    def trace(dbapi: Any, _record: Any, _proxy: Any) -> None:
        if dbapi not in traced:
            dbapi.pgconn.trace(log.fileno())
            dbapi.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            traced.append(dbapi)

    def read() -> list[list[str]]:
        log.flush()
        trips: list[list[str]] = [[]]
        for line in (tmp_path / "pq.trace").read_text().splitlines():
            if not line.startswith(("F\t", "B\t")):
                continue  # a message's text that runs over lines
            side, _size, kind, *rest = line.split("\t")
            if side == "B" and kind == "ReadyForQuery":
                trips.append([])
            elif side == "F" and kind in ("Query", "Parse"):
                sql = rest[0].strip().split('" "', 1)[-1] if kind == "Parse" else rest[0]
                word = sql.strip(' "').split()[0]
                trips[-1].append(
                    word + ("+COMMIT" if sql.rstrip('" ').endswith("; COMMIT") else "")
                )
        return [t for t in trips if t]

    event.listen(pg.engine, "checkout", trace)
    try:
        yield read
    finally:
        event.remove(pg.engine, "checkout", trace)
        for dbapi in traced:
            if not dbapi.closed:
                dbapi.pgconn.untrace()
        log.close()


def _writer(store: StateStore) -> Callable[[int], int]:
    control = Control(Policy.from_yaml(WRITE_POLICY), store)
    return protect("bench.write", effect="w:{n}", control=control)(lambda n: n)


def test_a_protected_call_is_four_round_trips(
    pg: StateStore, round_trips: Callable[[], list[list[str]]]
) -> None:
    write = _writer(pg)
    with context(agent="bench"):
        write(0)  # the freeze table is read once, then cached
        done = len(round_trips())
        assert write(1) == 1
    # The key and its events: one statement, its own transaction (no BEGIN, no COMMIT).
    # The outcome: BEGIN, the move with its event and the chain's next number, then the
    # receipt and the head with the COMMIT.
    assert round_trips()[done:] == [["WITH"], ["BEGIN"], ["WITH"], ["WITH+COMMIT"]]
    with pg.reading() as conn:
        assert verify_chain(conn).ok
        state = conn.execute(text("SELECT state FROM effects WHERE effect_key = 'w:1'")).scalar()
        assert state == "committed"


def test_a_duplicate_is_refused_in_five_round_trips(
    pg: StateStore, round_trips: Callable[[], list[list[str]]]
) -> None:
    write = _writer(pg)
    with context(agent="bench"):
        write(1)
        done = len(round_trips())
        with pytest.raises(DuplicateEffect):
            write(1)
    # The insert found the key taken and wrote nothing, on its own; the refusal is read and
    # written in one transaction that begins after it: the record read, the refusal's events
    # with the chain's next number, then its receipt and the head with the COMMIT.
    trips = round_trips()[done:]
    assert trips == [["WITH"], ["BEGIN"], ["SELECT"], ["WITH"], ["WITH+COMMIT"]], trips
    with pg.reading() as conn:
        assert verify_chain(conn).ok
        results = conn.execute(
            text("SELECT result FROM receipts WHERE effect_key = 'w:1' ORDER BY seq")
        ).scalars()
        assert list(results) == ["committed", "blocked"]


def test_a_connection_lost_with_the_commit_sent_is_never_run_again(pg: StateStore) -> None:
    control = Control(Policy.from_yaml(WRITE_POLICY), pg)
    action = control.action("bench.write", {"n": 7}, Principal("bench"))
    attempt = control.begin(action, "w:7")
    with pg.transaction() as conn:  # the first receipt's insert ends its own session
        conn.execute(text(KILL_ONCE))
    with pytest.raises(OutcomeUnknown, match="COMMIT sent"):
        control.finish(attempt, "committed")
    with pg.reading() as conn:
        # Killed before its COMMIT ran, and not run again blind on a new connection (that
        # could record a second outcome over a first one that did commit).
        assert conn.execute(text("SELECT last_value FROM kills")).scalar() == 1
        state = conn.execute(text("SELECT state FROM effects WHERE effect_key = 'w:7'")).scalar()
        assert state == "executing"  # under its lease; the sweep finds it ambiguous after
        assert conn.execute(text("SELECT count(*) FROM receipts")).scalar() == 0


KILL_ONCE = """
CREATE SEQUENCE kills;
CREATE FUNCTION kill_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF nextval('kills') = 1 THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER kill_once BEFORE INSERT ON receipts FOR EACH ROW EXECUTE FUNCTION kill_once();
"""


def test_a_reservation_killed_on_its_way_is_taken_on_a_new_connection(
    pg: StateStore, caplog: pytest.LogCaptureFixture
) -> None:
    write = _writer(pg)
    with context(agent="bench"):
        write(0)  # the freeze table is read once: the next reservation is its own transaction
        with pg.transaction() as conn:  # the reservation's events insert ends its own session
            conn.execute(text(KILL_ONCE.replace("ON receipts", "ON events")))
        with caplog.at_level("INFO", logger="ctrlrun.store"):
            assert write(1) == 1
    said = [r.getMessage() for r in caplog.records if "running the transaction again" in r.message]
    # Not "nothing was written": a statement that is its own transaction may have committed.
    assert len(said) == 1 and "if the server ran it" in said[0], said
    with pg.reading() as conn:  # killed once, taken on the second connection, and only once
        state = conn.execute(text("SELECT state FROM effects WHERE effect_key = 'w:1'")).scalar()
        assert state == "committed"
        reserved = "SELECT count(*) FROM events WHERE effect_key = 'w:1' AND type = :t"
        assert conn.execute(text(reserved), {"t": "EFFECT_RESERVED"}).scalar() == 1


def test_the_ledger_is_the_same_as_statement_by_statement(pg: StateStore, tmp_path: Any) -> None:
    sqlite = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        for store in (pg, sqlite):
            write = _writer(store)
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
