"""One ledger per test, on each engine: a fresh SQLite file and a fresh PostgreSQL database.

The PostgreSQL database (``ctrlrun_t_<random>`` on 127.0.0.1:5432) is created for the test and
dropped after it; when the server does not answer, the PostgreSQL cases are skipped.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event

from ctrlrun.store import StateStore, open_store

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
# One allowed action, a new effect key per call: what the store tests write with.
WRITE_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  bench.write:
    effect: "w:{n}"
    decision: allow
"""
PG_SKIP = "PostgreSQL is not answering on 127.0.0.1:5432 (user postgres, database test)"


def postgres_reachable() -> bool:
    try:
        import psycopg
    except ImportError:
        return False
    try:
        psycopg.connect(PG_ADMIN, connect_timeout=2).close()
    except psycopg.Error:
        return False
    return True


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A fresh, empty PostgreSQL database; yields its URL and drops it afterwards."""
    if not postgres_reachable():
        pytest.skip(PG_SKIP)
    import psycopg

    name = f"ctrlrun_t_{secrets.token_hex(6)}"
    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of a ledger that does not exist yet, on each engine in turn."""
    if request.param == "sqlite":
        (tmp_path / "ledger").mkdir()
        return f"sqlite:///{tmp_path / 'ledger' / 'state.db'}"
    url: str = request.getfixturevalue("pg_database")
    return url


@pytest.fixture
def store(store_url: str) -> Iterator[StateStore]:
    s = open_store(store_url)
    yield s
    s.close()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    """A WAL SQLite file ``g.db`` with a ``parent`` table and a ``child`` whose foreign key is
    checked at COMMIT (an orphan row makes the COMMIT itself fail)."""
    eng = create_engine(f"sqlite:///{tmp_path / 'g.db'}", connect_args={"timeout": 5})

    @event.listens_for(eng, "connect")
    def _connect(dbapi: Any, _record: Any) -> None:
        dbapi.isolation_level = None
        dbapi.execute("PRAGMA journal_mode=WAL")
        dbapi.execute("PRAGMA foreign_keys=ON")

    with eng.connect() as conn:
        conn.exec_driver_sql("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        conn.exec_driver_sql(
            "CREATE TABLE child (id INTEGER PRIMARY KEY, parent INTEGER "
            "REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)"
        )
        conn.commit()
    yield eng
    eng.dispose()
