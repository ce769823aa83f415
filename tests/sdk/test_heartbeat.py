"""The heartbeat renews a running call's lease in time, even while it sleeps for another."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

from ctrlrun import Action, Control, Policy, Principal, SQLiteStateStore
from ctrlrun import heartbeat as hb
from ctrlrun import ledger as L


def _lease_until(store: SQLiteStateStore, key: str) -> str:
    with store.reading() as conn:
        row = L.get_effect_row(conn, key)
    assert row is not None
    return str(row["lease_expires_at"])


def test_a_short_lease_is_renewed_while_the_thread_sleeps_for_a_long_one(
    policy_file: Path, store: SQLiteStateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The thread sleeps up to MAX_WAIT for the long lease's turn; a new call whose renewal is
    # due sooner must wake it, or its lease runs out before anyone renews it.
    monkeypatch.setattr(hb, "MAX_WAIT", 5.0)
    control = Control(Policy.from_file(policy_file), store)
    bot = Principal("bot", "alice")
    slow = control.begin(
        Action("refund", {"payment_id": "p1", "amount": 1}, bot),
        "refund:p1",
        lease=timedelta(seconds=60),
    )
    quick = control.begin(
        Action("refund", {"payment_id": "p2", "amount": 1}, bot),
        "refund:p2",
        lease=timedelta(seconds=0.9),
    )
    first = _lease_until(store, "refund:p2")
    with control.holding(slow):
        time.sleep(0.2)  # the thread is asleep now, for MAX_WAIT (the slow renewal is 20 s away)
        with control.holding(quick):
            time.sleep(0.7)  # past a third of 0.9 s: renewed once at least, before it ran out
            assert _lease_until(store, "refund:p2") > first
    control.finish(quick, "committed")
    control.finish(slow, "committed")
