"""The identical request re-sent while its approval is pending asks the same request again."""

from __future__ import annotations

from pathlib import Path

import pytest
from sdk_support import POLICY

from ctrlrun import Action, ApprovalRequired, Control, Policy, Principal, SQLiteStateStore
from ctrlrun import ledger as L
from ctrlrun.approvals import answer


def _ask(control: Control, amount: int, agent: str = "bot") -> str:
    action = Action("refund", {"payment_id": "p1", "amount": amount}, Principal(agent))
    with pytest.raises(ApprovalRequired) as asked:
        control.begin(action, "refund:p1")
    return asked.value.request_id


def test_a_resend_while_pending_is_the_same_request_and_a_change_is_a_new_one(
    tmp_path: Path,
) -> None:
    store = SQLiteStateStore(tmp_path / "state.db")
    control = Control(Policy.from_yaml(POLICY), store)
    first = _ask(control, 50_000)
    assert _ask(control, 50_000) == first == _ask(control, 50_000)  # no queue of copies
    other = _ask(control, 60_000)  # another amount: another action, another request
    someone = _ask(control, 50_000, agent="other-bot")  # another agent: another request
    assert len({first, other, someone}) == 3
    with store.reading() as conn:
        pending = [r["approval_id"] for r in L.pending_approvals(conn)]
        asked = conn.exec_driver_sql(
            "SELECT count(*) FROM events WHERE type = 'APPROVAL_REQUESTED'"
        ).scalar()
    assert sorted(pending) == sorted([first, other, someone]) and asked == 3

    with store.transaction() as conn:
        answer(conn, first, grant=True, approver="alice", now=store.clock())
    action = Action("refund", {"payment_id": "p1", "amount": 50_000}, Principal("bot"))
    attempt = control.begin(action, "refund:p1")  # the resend consumes the granted one
    assert attempt.approval is not None and attempt.approval.approval_id == first
    store.close()
