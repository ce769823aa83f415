"""Each store's clock: the host's on SQLite; the database's on PostgreSQL, whatever the host's
says (``ctrlrun.clocks``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ctrlrun import clocks
from ctrlrun.clocks import LedgerClock
from ctrlrun.store import StateStore, open_store


def test_the_store_decides_on_its_ledgers_clock(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(clocks, "_offset", lambda: timedelta(seconds=120))  # a host 2 min ahead
    ledger_now = store.clock()
    host_now = clocks.utc_now()
    real = datetime.now(UTC)
    if store.dialect == "postgresql":
        assert isinstance(store.clock, LedgerClock)
        assert abs((ledger_now - real).total_seconds()) < 5  # the database's time
        skew = store.clock.measure()
        assert 115 < skew.seconds < 125 and skew.beyond
        assert store.skew is skew
    else:
        assert store.skew is None  # the host's clock is the ledger's
        assert abs((ledger_now - host_now).total_seconds()) < 5


def test_a_reopened_postgres_store_reads_the_database_again(pg_database: str) -> None:
    store = open_store(pg_database)
    try:
        assert isinstance(store.clock, LedgerClock)
        assert store.skew is not None and not store.skew.beyond
    finally:
        store.close()
