"""The schedule of asks about ambiguous effects, on each engine: the upgrade from revision 0003,
sidecars sweeping one ledger together, and the indexes the sweep and the metric rely on."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, event, insert, inspect, select, text

from ctrlrun import checks
from ctrlrun.action import iso, utc_now
from ctrlrun.control import Control
from ctrlrun.policy import Policy
from ctrlrun.reconcilers.base import EffectFacts
from ctrlrun.reconcilers.sweep import sweep
from ctrlrun.schema import effects, events
from ctrlrun.store import HEAD_REVISION, StateStore, open_store

from .test_conformance import migrate_to, race, raw_engine

POLICY = "schema: ctrlrun.policy/v2\nactions:\n  k8s.scale:\n    decision: allow\n"
SCHEDULE = {"next_check_at", "checks", "check_answer", "check_attempt"}
# The statements a revision-0003 sidecar runs on effects: its column list, not the schema's.
OLD_COLUMNS = (
    "effect_key, state, action_id, attempt, lease_expires_at, action_name, action_json, "
    "idempotency_key, upstream, result_json, error, resolved_by, created_at, updated_at, "
    "attempt_started_at, committed_at"
)


def ambiguous_rows(n: int, prefix: str = "web", minutes_old: int = 5) -> list[dict[str, Any]]:
    when = iso(utc_now() - timedelta(minutes=minutes_old))
    return [
        {
            "effect_key": f"scale:eu:{prefix}{i}:6",
            "state": "ambiguous",
            "action_id": f"act_{prefix}_{i}",
            "attempt": 1,
            "action_name": "k8s.scale",
            "action_json": json.dumps({"name": "k8s.scale", "arguments": {"replicas": 6}}),
            "upstream": "kube",
            "created_at": when,
            "updated_at": when,
            "attempt_started_at": when,
        }
        for i in range(n)
    ]


class Slow:
    """A remote that never knows and takes a moment to say so; counts who it was asked about."""

    def __init__(self) -> None:
        self.asked: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, facts: EffectFacts) -> Any:
        with self._lock:
            self.asked[facts.effect_key] += 1
        time.sleep(0.002)  # the window in which a second sidecar could ask too
        return "unknown"


def test_sidecars_sweeping_one_ledger_ask_about_each_effect_once_a_slot(
    store: StateStore, store_url: str
) -> None:
    n, sidecars = 30, 4
    with store.transaction() as conn:
        conn.execute(insert(effects), ambiguous_rows(n))
    stores = [open_store(store_url) for _ in range(sidecars)]
    now = [utc_now()]
    controls = [Control(Policy.from_yaml(POLICY), s, clock=lambda: now[0]) for s in stores]
    remotes = [Slow() for _ in range(sidecars)]
    try:
        for round_ in (1, 2):
            race(sidecars, lambda i: sweep(controls[i], {"kube": remotes[i]}))
            asked = sum((r.asked for r in remotes), Counter())
            assert set(asked.values()) == {round_}, asked  # each effect once per slot
            now[0] += timedelta(seconds=30)  # the next slot
        assert sum(1 for r in remotes if r.asked) > 1  # the work really was shared
        with store.reading() as conn:
            rows = conn.execute(select(effects.c.checks, effects.c.check_answer)).all()
            written = conn.execute(select(events.c.type)).scalars().all()
        assert set(rows) == {(2, "unknown")}
        assert Counter(written) == {"RECONCILIATION_STARTED": n, "RECONCILIATION_RESOLVED": n}
    finally:
        for s in stores:
            s.close()


def test_upgrade_from_0003_schedules_old_records_and_old_code_keeps_working(
    store_url: str,
) -> None:
    migrate_to(store_url, "0003")
    old = raw_engine(store_url)
    try:
        with old.begin() as conn:
            assert not SCHEDULE & {c["name"] for c in inspect(conn).get_columns("effects")}
            conn.execute(insert(effects.c.effect_key.table), ambiguous_rows(1, "before"))
        s = open_store(store_url)  # upgrades to the head under the lock
        try:
            with s.reading() as conn:
                version = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
                assert version == HEAD_REVISION  # through 0004, to the newest
                assert {c["name"] for c in inspect(conn).get_columns("effects")} >= SCHEDULE
                assert "effects_checks_due" in {
                    i["name"] for i in inspect(conn).get_indexes("effects")
                }
            with old.begin() as conn:
                write_like_0003(conn)
            control = Control(Policy.from_yaml(POLICY), s)
            remote = Slow()
            # Records from before the upgrade and from a 0003 sidecar after it: never asked.
            assert sorted(k for k, _ in sweep(control, {"kube": remote})) == [
                "scale:eu:after0:6",
                "scale:eu:before0:6",
            ]
            with old.begin() as conn:
                read_and_settle_like_0003(conn, "scale:eu:before0:6")
            assert sweep(control, {"kube": remote}, ask_now=True) == [
                ("scale:eu:after0:6", "unknown")
            ]
        finally:
            s.close()
    finally:
        old.dispose()


def write_like_0003(conn: Connection) -> None:
    """A revision-0003 sidecar leaves an ambiguous record: its own columns only."""
    (row,) = ambiguous_rows(1, "after")
    names = [c.strip() for c in OLD_COLUMNS.split(",")]
    values = {c: row.get(c) for c in names}
    conn.execute(
        text(f"INSERT INTO effects ({OLD_COLUMNS}) VALUES ({', '.join(':' + c for c in names)})"),
        values,
    )


def read_and_settle_like_0003(conn: Connection, key: str) -> None:
    """A revision-0003 sidecar reads a record by its column list and settles it."""
    row = conn.execute(
        text(f"SELECT {OLD_COLUMNS} FROM effects WHERE effect_key = :k"), {"k": key}
    ).one()
    assert row.state == "ambiguous"
    moved = conn.execute(
        text(
            "UPDATE effects SET state = 'committed', updated_at = :now, resolved_by = 'reconcile' "
            "WHERE effect_key = :k AND state = 'ambiguous' AND action_id = :a AND attempt = :n"
        ),
        {"now": iso(utc_now()), "k": key, "a": row.action_id, "n": row.attempt},
    )
    assert moved.rowcount == 1


def test_a_reader_upgrades_an_older_ledger(store_url: str) -> None:
    migrate_to(store_url, "0003")
    s = open_store(store_url, create=False)  # the CLI's way: never create, but do upgrade
    try:
        with s.reading() as conn:
            assert (
                conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
                == HEAD_REVISION
            )
    finally:
        s.close()


@contextmanager
def statements(store: StateStore) -> Iterator[list[tuple[str, Any]]]:
    """The SQL (and parameters) the store's engine runs meanwhile."""
    seen: list[tuple[str, Any]] = []

    def grab(_c: Any, _cur: Any, sql: str, params: Any, _ctx: Any, _many: bool) -> None:
        seen.append((sql, params))

    event.listen(store.engine, "before_cursor_execute", grab)
    try:
        yield seen
    finally:
        event.remove(store.engine, "before_cursor_execute", grab)


def plan(conn: Connection, sql: str, params: Any) -> str:
    if conn.dialect.name == "sqlite":
        rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, params).all()
        return "\n".join(str(r[-1]) for r in rows)
    conn.exec_driver_sql("SET LOCAL enable_seqscan = off")  # may it use an index at all?
    return "\n".join(str(r[0]) for r in conn.exec_driver_sql("EXPLAIN " + sql, params))


def test_the_stale_count_is_an_index_range_not_a_scan(store: StateStore) -> None:
    with store.transaction() as conn:
        conn.execute(insert(effects), ambiguous_rows(3, minutes_old=120) + ambiguous_rows(2, "n"))
    with statements(store) as seen, store.reading() as conn:
        assert checks.count_ambiguous_before(conn, utc_now() - timedelta(hours=1)) == 3
    (sql, params) = next((q, p) for q, p in seen if "count(" in q)
    with store.reading() as conn:
        explained = plan(conn, sql, params)
    assert "INDEX effects_by_state" in explained or "Index" in explained, explained
    assert "SCAN effects" not in explained and "Seq Scan" not in explained, explained


def test_the_due_query_reads_only_ambiguous_records_by_index(store: StateStore) -> None:
    with store.transaction() as conn:
        conn.execute(insert(effects), ambiguous_rows(3))
    with statements(store) as seen, store.reading() as conn:
        assert len(checks.due(conn, utc_now(), {"kube"}, 2)) == 2
        assert checks.due(conn, utc_now(), {"kube"}, 0) == []
        assert checks.due(conn, utc_now(), set(), 5) == []
    with store.reading() as conn:
        for sql, params in seen:
            explained = plan(conn, sql, params)
            assert "SCAN effects" not in explained and "Seq Scan" not in explained, explained
