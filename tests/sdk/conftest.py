"""Fixtures for the kernel tests: a policy file, a SQLite ledger and a Control on a fake clock."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sdk_support import PG_ADMIN, POLICY, Clock, postgres_reachable

from ctrlrun import Control, Policy, SQLiteStateStore


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "ctrlrun.yaml"
    path.write_text(POLICY, encoding="utf-8")
    return path


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / ".ctrlrun" / "state.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[SQLiteStateStore]:
    s = SQLiteStateStore(db_path)
    yield s
    s.close()


@pytest.fixture
def control(policy_file: Path, store: SQLiteStateStore, clock: Clock) -> Control:
    return Control(Policy.from_file(policy_file), store, clock=clock)


@pytest.fixture
def make_control(store: SQLiteStateStore, clock: Clock) -> Callable[..., Control]:
    """A Control on the shared ledger and clock with another policy text."""

    def make(policy_text: str = POLICY, **kwargs: Any) -> Control:
        kwargs.setdefault("clock", clock)
        return Control(Policy.from_yaml(policy_text), store, **kwargs)

    return make


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test (dropped after); skipped if no server."""
    if not postgres_reachable():
        pytest.skip("PostgreSQL is not reachable on 127.0.0.1:5432")
    import psycopg

    name = f"ctrlrun_test_{secrets.token_hex(6)}"
    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        # A scratch database: no need to wait for the disk at each commit (locking and
        # visibility, which the tests are about, are unchanged).
        admin.execute(f'ALTER DATABASE "{name}" SET synchronous_commit TO off')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
