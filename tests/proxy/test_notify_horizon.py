"""How long a webhook's cursor waits at most for an event id to commit, from the session
limits a PostgreSQL ledger runs under."""

from __future__ import annotations

import pytest

from ctrlrun.pg_session import TIMEOUTS
from ctrlrun.proxy.notify_horizon import FALLBACK_LIMIT, limit_for, seconds


@pytest.mark.parametrize(
    ("value", "expected"),
    [("5s", 5.0), ("500ms", 0.5), ("2000", 2.0), ("1min", 60.0), ("0", None), ("0s", None)],
)
def test_seconds(value: str, expected: float | None) -> None:
    assert seconds(value) == expected


@pytest.mark.parametrize(
    ("timeouts", "expected"),
    [
        (TIMEOUTS, 100.0),  # 4 x (10 s statement + 15 s idle)
        ({"statement_timeout": "1s", "idle_in_transaction_session_timeout": "2s"}, 60.0),
        ({"statement_timeout": "0", "idle_in_transaction_session_timeout": "15s"}, FALLBACK_LIMIT),
        ({}, FALLBACK_LIMIT),  # SQLite: no limits (and no gaps)
    ],
)
def test_limit_for(timeouts: dict[str, str], expected: float) -> None:
    assert limit_for(timeouts) == expected
