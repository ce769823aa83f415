"""Every PostgreSQL session of a ledger runs under lock, statement and idle-in-transaction
limits; a store URL may change them, and a bad value is one clear line."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from ctrlrun.errors import InvalidArgument, StoreError
from ctrlrun.pg_session import TIMEOUTS, options_string, session_options
from ctrlrun.store import PostgresStateStore

NAMES = tuple(TIMEOUTS)


def shown(store: PostgresStateStore) -> dict[str, str]:
    with store.reading() as conn:
        return {n: str(conn.exec_driver_sql(f"SHOW {n}").scalar()) for n in NAMES}


def test_defaults_are_a_few_seconds_and_the_url_may_change_them() -> None:
    url, settings = session_options(make_url("postgresql://h/db?lock_timeout=2s&sslmode=disable"))
    assert settings["lock_timeout"] == "2s"
    assert settings["statement_timeout"] == TIMEOUTS["statement_timeout"]
    assert dict(url.query) == {"sslmode": "disable"}
    assert options_string({"lock_timeout": "2s"}, "-c search_path=x") == (
        "-c lock_timeout=2s -c search_path=x"
    )


@pytest.mark.parametrize("value", ["soon", "5 hours", "-1", "1.5s"])
def test_a_bad_value_is_refused_by_name(value: str) -> None:
    with pytest.raises(InvalidArgument, match="lock_timeout"):
        session_options(make_url(f"postgresql://h/db?lock_timeout={value}"))


def test_every_session_runs_under_the_limits(pg_database: str) -> None:
    store = PostgresStateStore(pg_database + "?statement_timeout=3s")
    try:
        assert shown(store) == {**TIMEOUTS, "statement_timeout": "3s"}
    finally:
        store.close()


def test_a_statement_past_its_limit_is_a_store_error(pg_database: str) -> None:
    store = PostgresStateStore(pg_database + "?statement_timeout=200ms")
    try:
        with pytest.raises(StoreError, match="statement timeout"), store.reading() as conn:
            conn.exec_driver_sql("SELECT pg_sleep(2)")
        store.ping()  # the session (or the pool's next one) is usable again
    finally:
        store.close()
