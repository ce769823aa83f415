"""The ledger contract, run unchanged on SQLite and on PostgreSQL (see conftest.py).

Every race here is real: threads (or processes) released together by a barrier, each on its
own connection, so SQLite's write lock and PostgreSQL's row locks are what is being tested.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, inspect, select, text
from sqlalchemy.engine import make_url

from ctrlrun import ledger
from ctrlrun import store as store_module
from ctrlrun.action import Action, Principal, iso, utc_now
from ctrlrun.approvals import answer
from ctrlrun.control import Control
from ctrlrun.errors import (
    ApprovalMismatch,
    ApprovalRequired,
    DuplicateEffect,
    InvalidArgument,
    SchemaMismatch,
)
from ctrlrun.events import EventType
from ctrlrun.policy import Policy
from ctrlrun.receipts import load_receipts, verify_chain, write_receipt
from ctrlrun.schema import events, receipts
from ctrlrun.states import TRANSITIONS, EffectState
from ctrlrun.store import HEAD_REVISION, StateStore, open_store

T = TypeVar("T")
THREADS = 16
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  refund:
    effect: "refund:{payment_id}"
    decision: allow
  wire:
    decision: approve
  note:
    decision: allow
"""
AGENT = Principal("conformance")


def race(n: int, fn: Callable[[int], T]) -> list[T | BaseException]:
    """Run ``fn(0..n-1)`` in ``n`` threads released at once; results (or errors) in order."""
    barrier = threading.Barrier(n)
    results: list[T | BaseException] = [RuntimeError("did not run")] * n

    def run(i: int) -> None:
        barrier.wait(timeout=30)
        try:
            results[i] = fn(i)
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a racing thread hung"
    return results


def effect_values(
    key: str, action_id: str, *, state: EffectState = EffectState.EXECUTING, attempt: int = 1
) -> dict[str, Any]:
    now = iso(utc_now())
    return {
        "effect_key": key,
        "state": state.value,
        "action_id": action_id,
        "attempt": attempt,
        "lease_expires_at": iso(utc_now() + timedelta(minutes=5)),
        "action_name": "refund",
        "created_at": now,
        "updated_at": now,
        "attempt_started_at": now,
    }


def put_effect(store: StateStore, key: str, action_id: str = "act_a", **kw: Any) -> None:
    """A record in any state (the ledger itself only ever inserts EXECUTING ones)."""
    values = effect_values(key, action_id, **kw)
    columns = ", ".join(values)
    with store.transaction() as conn:
        conn.execute(
            text(f"INSERT INTO effects ({columns}) VALUES ({', '.join(':' + c for c in values)})"),
            values,
        )


def state_of(store: StateStore, key: str) -> tuple[str, str, int]:
    with store.reading() as conn:
        rec = ledger.get_effect(conn, key)
    assert rec is not None
    return rec.state.value, rec.action_id, rec.attempt


# -- reservation --------------------------------------------------------------------------


def test_reservation_insert_has_exactly_one_winner(store: StateStore) -> None:
    def reserve(i: int) -> bool:
        with store.transaction() as conn:
            return ledger.insert_effect(conn, effect_values("refund:race", f"act_{i:02d}"))

    results = race(THREADS, reserve)
    assert all(isinstance(r, bool) for r in results), results
    assert results.count(True) == 1
    winner = f"act_{results.index(True):02d}"
    assert state_of(store, "refund:race") == ("executing", winner, 1)


def test_kernel_reservation_runs_the_executor_once(store: StateStore) -> None:
    control = Control(Policy.from_yaml(POLICY), store)
    ran: list[int] = []

    def attempt(i: int) -> str:
        action = Action("refund", {"payment_id": "p1", "amount": 100}, AGENT)
        try:
            control.execute(action, lambda: ran.append(i), "refund:p1")
        except DuplicateEffect as exc:
            return exc.state
        return "ran"

    results = race(THREADS, attempt)
    print(f"threads={THREADS} executions={len(ran)} refusals={THREADS - len(ran)}")
    assert len(ran) == 1
    assert results.count("ran") == 1
    assert set(results) <= {"ran", "committed", "in_progress"}, results
    assert state_of(store, "refund:p1")[0] == "committed"


# -- compare-and-set transitions ----------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "stale"),
    [("state", EffectState.AMBIGUOUS), ("action_id", "act_other"), ("attempt", 2)],
)
def test_cas_refuses_a_stale_write(store: StateStore, field: str, stale: Any) -> None:
    put_effect(store, "k", "act_a")
    expected: dict[str, Any] = {"old": EffectState.EXECUTING, "action_id": "act_a", "attempt": 1}
    expected["old" if field == "state" else field] = stale
    with store.transaction() as conn:
        # COMMITTED is a legal target from both AMBIGUOUS and EXECUTING: only staleness refuses.
        moved = ledger.move_effect(
            conn, "k", new=EffectState.COMMITTED, values={"updated_at": iso(utc_now())}, **expected
        )
    assert moved is False
    assert state_of(store, "k") == ("executing", "act_a", 1)
    with store.transaction() as conn:
        assert ledger.move_effect(
            conn,
            "k",
            old=EffectState.EXECUTING,
            new=EffectState.COMMITTED,
            action_id="act_a",
            attempt=1,
            values={},
        )
        # The same write again is now stale too: the record has moved on.
        assert not ledger.move_effect(
            conn,
            "k",
            old=EffectState.EXECUTING,
            new=EffectState.FAILED,
            action_id="act_a",
            attempt=1,
            values={},
        )
    assert state_of(store, "k") == ("committed", "act_a", 1)


def test_cas_concurrent_outcomes_one_wins(store: StateStore) -> None:
    put_effect(store, "k", "act_a")
    outcomes = [EffectState.COMMITTED, EffectState.FAILED, EffectState.AMBIGUOUS]

    def move(i: int) -> bool:
        with store.transaction() as conn:
            return ledger.move_effect(
                conn,
                "k",
                old=EffectState.EXECUTING,
                new=outcomes[i % 3],
                action_id="act_a",
                attempt=1,
                values={"error": f"writer {i}"},
            )

    results = race(THREADS, move)
    assert results.count(True) == 1, results
    assert state_of(store, "k")[0] == outcomes[results.index(True) % 3].value


def test_illegal_transitions_raise_and_write_nothing(store: StateStore) -> None:
    stored = [s for s in EffectState if s is not EffectState.NEW]
    illegal = [(a, b) for a in stored for b in EffectState if (a, b) not in TRANSITIONS]
    for old, new in illegal:
        key = f"k:{old.value}:{new.value}"
        put_effect(store, key, state=old)
        with pytest.raises(InvalidArgument, match="is not allowed"), store.transaction() as conn:
            ledger.move_effect(
                conn,
                key,
                old=old,
                new=new,
                action_id="act_a",
                attempt=1,
                values={"error": "must not be written"},
            )
        assert state_of(store, key) == (old.value, "act_a", 1)
    with store.reading() as conn:
        assert (
            conn.execute(text("SELECT count(*) FROM effects WHERE error IS NOT NULL")).scalar() == 0
        )


# -- receipts, approvals, events ------------------------------------------------------------


def test_receipt_chain_head_advances_atomically(store: StateStore) -> None:
    writers, per_writer = 8, 25

    def write(i: int) -> list[int]:
        seqs = []
        for j in range(per_writer):
            with store.transaction() as conn:
                r = write_receipt(
                    conn,
                    {
                        "action_id": f"act_{i:02d}{j:030d}",
                        "action": "note",
                        "arguments": {"i": i},
                        "effect_key": None,
                        "result": "committed",
                        "finished_at": iso(utc_now()),
                    },
                )
            seqs.append(int(r.seq))
        return seqs

    results = race(writers, write)
    seqs = sorted(s for r in results for s in r)  # type: ignore[union-attr]
    print(f"writers={writers} receipts={len(seqs)} gaps={writers * per_writer - len(set(seqs))}")
    assert seqs == list(range(1, writers * per_writer + 1))
    with store.reading() as conn:
        report = verify_chain(conn)
        chain = load_receipts(conn)
    assert report.ok, report.breaks
    assert report.verified == report.head_seq == writers * per_writer
    for before, after in itertools.pairwise(chain):
        assert after.prev_hash == before.hash


def test_approval_is_consumed_once(store: StateStore) -> None:
    control = Control(Policy.from_yaml(POLICY), store)

    def action() -> Action:  # a fresh action id each time; the hash is the same
        return Action("wire", {"wire_id": "w1", "amount": 500}, AGENT)

    with pytest.raises(ApprovalRequired) as required:
        control.execute(action(), lambda: None)
    request_id = required.value.request_id
    with store.transaction() as conn:
        answer(conn, request_id, grant=True, approver="human", now=utc_now())
    ran: list[int] = []

    def use(i: int) -> str:
        try:
            control.execute(action(), lambda: ran.append(i), approval_id=request_id)
        except ApprovalMismatch as exc:
            return exc.reason
        return "ran"

    results = race(THREADS, use)
    assert len(ran) == 1
    assert sorted(results) == ["consumed"] * (THREADS - 1) + ["ran"]  # type: ignore[type-var]
    with store.reading() as conn:
        row = ledger.approval_row(conn, request_id)
        consumed = conn.execute(
            text("SELECT count(*) FROM events WHERE type = 'APPROVAL_CONSUMED'")
        ).scalar()
    assert row is not None and row["status"] == "consumed"
    assert consumed == 1


def test_events_append_from_many_writers(store: StateStore) -> None:
    writers, per_writer = 8, 50

    def append(i: int) -> None:
        for j in range(per_writer):
            with store.transaction() as conn:
                ledger.append_event(
                    conn,
                    utc_now(),
                    EventType.EXECUTION_STARTED,
                    action_id=f"act_w{i}",
                    data={"j": j},
                )

    assert all(r is None for r in race(writers, append))
    with store.reading() as conn:
        rows = conn.execute(select(events.c.event_id, events.c.action_id, events.c.data_json)).all()
    assert len(rows) == writers * per_writer
    assert len({r[0] for r in rows}) == len(rows)
    for i in range(writers):
        mine = sorted((r[0], json.loads(r[2])["j"]) for r in rows if r[1] == f"act_w{i}")
        assert [j for _, j in mine] == list(range(per_writer))  # in order, none lost


# -- opening, schema revisions, rolling upgrades -----------------------------------------------

OPENER = """\
import sys, time
from sqlalchemy import text
from ctrlrun.store import open_store
url, start = sys.argv[1], float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
s = open_store(url)
with s.reading() as conn:
    print(conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one())
s.close()
"""


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_fresh_database_opened_by_four_processes(store_url: str) -> None:
    start = time.time() + 2.5  # past every interpreter's start-up, so they really collide
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, store_url, str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in outs]
    assert [out.strip() for out, _ in outs] == [HEAD_REVISION] * 4
    s = open_store(store_url, create=False)
    try:
        with s.reading() as conn:
            assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar() == 1
            assert conn.execute(text("SELECT count(*) FROM receipt_chain")).scalar() == 1
            assert {"effects", "events", "receipts", "receipt_chain", "approvals"} <= set(
                inspect(conn).get_table_names()
            )
    finally:
        s.close()


def test_unknown_revision_is_a_schema_mismatch(
    store: StateStore, store_url: str, tmp_path: Any
) -> None:
    with store.transaction() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    store.close()
    with pytest.raises(SchemaMismatch) as err:
        open_store(store_url)
    message = str(err.value)
    assert "\n" not in message
    assert "9999" in message and "upgrade ctrlrun" in message
    cli = subprocess.run(
        [sys.executable, "-m", "ctrlrun.cli", "receipts", "--store-url", store_url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert cli.returncode == 2  # a ledger this ctrlrun cannot use: configuration, not "absent"
    assert "Traceback" not in cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1, cli.stderr
    assert "9999" in cli.stderr


def raw_engine(url: str) -> Engine:
    """A bare engine on the ledger's database: no store, so no migration on opening."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return create_engine(parsed)


def migrate_to(url: str, revision: str) -> None:
    """Run the migrations up to ``revision`` with the Config the store builds (store._migrate)."""
    engine = raw_engine(url)
    try:
        with engine.begin() as conn:
            cfg = Config()
            cfg.set_main_option("script_location", str(store_module._MIGRATIONS))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
    finally:
        engine.dispose()


def write_like_0001(conn: Any, now: str) -> None:
    """What a revision-0001 sidecar writes: an effect and a chained receipt, no action column."""
    conn.execute(
        text(
            "INSERT INTO effects (effect_key, state, action_id, attempt, action_name, created_at, "
            "updated_at) VALUES ('refund:old', 'committed', 'act_old', 1, 'refund', :now, :now)"
        ),
        {"now": now},
    )
    seq, prev = ledger.advance_chain(conn)
    doc = {
        "schema": "ctrlrun.receipt/v3",
        "receipt_id": "ctr_" + "0" * 32,
        "action_id": "act_old",
        "action": "refund",
        "arguments": {"payment_id": "old"},
        "effect_key": "refund:old",
        "result": "committed",
        "finished_at": now,
        "seq": seq,
        "prev_hash": prev,
    }
    from ctrlrun.action import canonical_bytes, sha256

    body = canonical_bytes(doc).decode()
    digest = sha256(body.encode())
    conn.execute(
        text(
            "INSERT INTO receipts (receipt_id, action_id, effect_key, result, json, ts, seq, "
            "prev_hash, hash, event_pos) VALUES (:rid, 'act_old', 'refund:old', 'committed', "
            ":body, :now, :seq, :prev, :hash, NULL)"
        ),
        {
            "rid": doc["receipt_id"],
            "body": body,
            "now": now,
            "seq": seq,
            "prev": prev,
            "hash": digest,
        },
    )
    conn.execute(text("UPDATE receipt_chain SET hash = :h WHERE id = 1"), {"h": digest})


def test_rolling_upgrade_0001_and_0002_share_a_ledger(store_url: str) -> None:
    migrate_to(store_url, "0001")
    # At 0001: the revision is recorded and the receipts table has no action column yet.
    check = raw_engine(store_url)
    try:
        with check.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0001"
            assert "action" not in {c["name"] for c in inspect(conn).get_columns("receipts")}
    finally:
        check.dispose()

    # The new code opens it (upgrading to the head under the lock) and writes.
    s = open_store(store_url)
    try:
        control = Control(Policy.from_yaml(POLICY), s)
        control.execute(
            Action("refund", {"payment_id": "new", "amount": 1}, AGENT), lambda: None, "refund:new"
        )
        with s.reading() as conn:
            version = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
            assert version == HEAD_REVISION
        # A sidecar still on 0001 keeps working against the newer schema.
        with s.transaction() as conn:
            write_like_0001(conn, iso(utc_now()))
        with s.reading() as conn:
            old_reader = conn.execute(
                text(
                    "SELECT effect_key, state, action_id, attempt, lease_expires_at, action_name, "
                    "action_json, idempotency_key, upstream, result_json, error, resolved_by, "
                    "created_at, updated_at, attempt_started_at, committed_at FROM effects "
                    "ORDER BY effect_key"
                )
            ).all()
            old_receipts = conn.execute(
                text(
                    "SELECT receipt_id, action_id, effect_key, result, json, ts, seq, prev_hash, "
                    "hash, event_pos FROM receipts ORDER BY seq"
                )
            ).all()
        assert [(r[0], r[1]) for r in old_reader] == [
            ("refund:new", "committed"),
            ("refund:old", "committed"),
        ]
        assert [r[6] for r in old_receipts] == [1, 2]
        # ...and the new code reads what the old one wrote: chain intact, counts by action.
        control.execute(
            Action("refund", {"payment_id": "new2", "amount": 1}, AGENT),
            lambda: None,
            "refund:new2",
        )
        with s.reading() as conn:
            assert verify_chain(conn).ok
            rows = conn.execute(
                select(receipts.c.seq, receipts.c.action).order_by(receipts.c.seq)
            ).all()
            from ctrlrun import views

            stats = views.stats(conn)
        assert rows == [(1, "refund"), (2, None), (3, "refund")]
        assert stats["by_action"] == {"refund": 3}, stats
    finally:
        s.close()
