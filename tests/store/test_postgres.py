"""What only PostgreSQL has: a server that can be down, URL forms, the advisory lock, pooled
connections that the server drops."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text

from ctrlrun import ledger
from ctrlrun.action import utc_now
from ctrlrun.errors import SchemaMismatch, StoreError
from ctrlrun.events import EventType
from ctrlrun.store import _PG_LOCK_KEY, HEAD_REVISION, PostgresStateStore, open_store

from .conftest import PG_ADMIN

DOWN = "postgresql://postgres@127.0.0.1:1/x"  # nothing listens on port 1


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ctrlrun.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def test_server_down_is_one_clear_store_error() -> None:
    started = time.monotonic()
    with pytest.raises(StoreError) as err:
        open_store(DOWN)
    message = str(err.value)
    print(f"error: {message}")
    assert time.monotonic() - started < 10
    assert "\n" not in message
    assert "127.0.0.1" in message and "cannot open the ledger" in message


@pytest.mark.parametrize(
    "command", [["receipts"], ["effects"], ["stats"], ["receipts", "--verify-chain"]]
)
def test_cli_with_the_server_down_says_one_line(command: list[str], tmp_path: Path) -> None:
    done = cli(*command, "--store-url", DOWN, cwd=tmp_path)
    assert done.returncode == 2, done  # an unreachable store is a configuration error
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("ctrlrun: ") and "127.0.0.1" in lines[0]


def test_proxy_check_with_the_server_down_exits_2(tmp_path: Path) -> None:
    policy = tmp_path / "ctrlrun.yaml"
    policy.write_text("schema: ctrlrun.policy/v2\nactions:\n  note:\n    decision: allow\n")
    done = cli(
        "proxy",
        "--policy",
        str(policy),
        "--store-url",
        DOWN,
        "--listen",
        "127.0.0.1:0",
        "--check",
        cwd=tmp_path,
    )
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_password_never_shown() -> None:
    with pytest.raises(StoreError) as err:
        open_store("postgresql://postgres:s3cret-pw@127.0.0.1:1/x")
    assert "s3cret-pw" not in str(err.value)
    assert "***" in str(err.value)


@pytest.mark.parametrize("scheme", ["postgresql", "postgres", "postgresql+psycopg"])
def test_url_forms_open_one_ledger(pg_database: str, scheme: str) -> None:
    url = pg_database.replace("postgresql://", f"{scheme}://", 1)
    s = open_store(url)
    try:
        assert isinstance(s, PostgresStateStore)
        with s.transaction() as conn:
            ledger.append_event(conn, utc_now(), EventType.EXECUTION_STARTED, action_id=scheme)
        with s.reading() as conn:
            assert (
                conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
                == HEAD_REVISION
            )
    finally:
        s.close()


def test_opening_waits_for_the_migration_lock(pg_database: str) -> None:
    """A second opener waits on the advisory lock, then finds the schema current."""
    name = pg_database.rsplit("/", 1)[1]
    holder = psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{name}", autocommit=True)
    opened: list[object] = []
    try:
        holder.execute("SELECT pg_advisory_lock(%s)", (_PG_LOCK_KEY,))
        t = threading.Thread(target=lambda: opened.append(open_store(pg_database)))
        t.start()
        t.join(1.5)
        assert t.is_alive() and not opened, "the opener did not wait for the lock"
        holder.execute("SELECT pg_advisory_unlock(%s)", (_PG_LOCK_KEY,))
        t.join(30)
        assert opened
    finally:
        holder.close()
    s = opened[0]
    assert isinstance(s, PostgresStateStore)
    s.close()


def test_foreign_database_is_a_schema_mismatch(pg_database: str) -> None:
    name = pg_database.rsplit("/", 1)[1]
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{name}", autocommit=True) as c:
        c.execute("CREATE TABLE effects (id int)")
    with pytest.raises(SchemaMismatch, match="not a ctrlrun ledger"):
        open_store(pg_database)


def test_pool_recovers_when_the_server_drops_connections(pg_database: str) -> None:
    """Connections killed by the server (restart, failover, idle reaper): no operator action."""
    name = pg_database.rsplit("/", 1)[1]
    s = open_store(pg_database)
    try:
        s.ping()
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            ).fetchone()
        assert killed is not None and killed[0] >= 1
        outcomes = []
        for _ in range(3):
            try:
                s.ping()
                outcomes.append("ok")
            except StoreError as exc:
                assert "\n" not in str(exc)
                outcomes.append("error")
        print(f"after the server dropped the pool: {outcomes}")
        # At most the one call that found the dead connection fails; the pool then reconnects.
        assert outcomes[-1] == "ok" and outcomes.count("error") <= 1
    finally:
        s.close()
