"""Unanswered approval requests are recorded expired once, when their time is up."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sdk_support import POLICY

from ctrlrun import Action, ApprovalRequired, Control, Policy, Principal, SQLiteStateStore
from ctrlrun import ledger as L
from ctrlrun.action import utc_now
from ctrlrun.approval_expiry import expire_due


def _ask(control: Control, payment: str) -> str:
    action = Action("refund", {"payment_id": payment, "amount": 50_000}, Principal("bot"))
    with pytest.raises(ApprovalRequired) as asked:
        control.begin(action, f"refund:{payment}")
    return asked.value.request_id


def test_only_requests_past_their_time_expire_and_each_once(tmp_path: Path) -> None:
    store = SQLiteStateStore(tmp_path / "state.db")
    control = Control(Policy.from_yaml(POLICY), store, approval_ttl=timedelta(minutes=15))
    late, fresh = _ask(control, "p1"), _ask(control, "p2")
    later = utc_now() + timedelta(minutes=10)
    with store.transaction() as conn:
        conn.exec_driver_sql(
            "UPDATE approvals SET expires_at = '2000-01-01T00:00:00.000000Z' WHERE approval_id = ?",
            (late,),
        )
    assert expire_due(store, later) == [late]
    assert expire_due(store, later) == []  # recorded once
    with store.reading() as conn:
        pending = [r["approval_id"] for r in L.pending_approvals(conn)]
        kinds = [
            r[0]
            for r in conn.exec_driver_sql(
                "SELECT type FROM events WHERE approval_id = ? ORDER BY event_id", (late,)
            )
        ]
    assert pending == [fresh]
    assert kinds.count("APPROVAL_EXPIRED") == 1
    store.close()
