"""Budgets: ``over: approve`` asks a human past the limit; a failed effect gives its amount back,
also when an AMBIGUOUS one is resolved ``failed`` later (by a reconciler or ``ctrlrun resolve``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sdk_support import events, run_cli

from ctrlrun import (
    Action,
    ApprovalMismatch,
    ApprovalRequired,
    BudgetExceeded,
    Control,
    Policy,
    PolicyError,
    Principal,
    SQLiteStateStore,
)
from ctrlrun.action import utc_now
from ctrlrun.admission import plan_admission
from ctrlrun.approvals import answer
from ctrlrun.budgets import BudgetAsk
from ctrlrun.plan import ConsumeBudget, Facts, InsertApproval, Verdict
from ctrlrun.policy import Decision, Evaluation

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ACTION = Action("refund", {"payment_id": "p1", "amount": 300}, Principal("bot"))
ALLOW = Evaluation(Decision.ALLOW, "decision")
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  refund:
    effect: "refund:{payment_id}"
    decision: allow
    budget: {sum: amount, max: 1000, per: 1d, by: agent, over: approve}
  payout:
    effect: "payout:{payout_id}"
    decision: allow
    budget: {sum: amount, max: 1000, per: 1d, by: agent}
"""


def ask(spent: int | None, charge: int | None = 300) -> BudgetAsk:
    return BudgetAsk(
        "refund", "agent:bot", "2026-03-01T00:00:00.000Z", 1000, charge, spent, "r", "approve"
    )


def facts(budget: BudgetAsk, **kw: object) -> Facts:
    return Facts(
        action=ACTION,
        effect_key="refund:p1",
        evaluation=ALLOW,
        now=NOW,
        lease=timedelta(minutes=5),
        policy_hash="sha256:x",
        budget=budget,
        **kw,  # type: ignore[arg-type]
    )


def test_past_the_limit_over_approve_asks_and_a_granted_approval_spends_past_it() -> None:
    asked = plan_admission(facts(ask(800), request_id="apr_1"))
    assert asked.verdict is Verdict.NEEDS_APPROVAL
    (insert,) = [w for w in asked.writes if isinstance(w, InsertApproval)]
    assert insert.values["action_hash"] == ACTION.hash  # for exactly that action
    (requested,) = [e for e in asked.events if e.type == "APPROVAL_REQUESTED"]
    assert "past its budget" in requested.data["budget"] and "200 left" in requested.data["budget"]

    row = {"status": "granted", "action_hash": ACTION.hash, "approver": "alice"}
    row["expires_at"] = "2026-03-01T12:10:00.000Z"
    ran = plan_admission(facts(ask(800), approval_id="apr_1", approval=row))
    assert ran.verdict is Verdict.RESERVE
    (spend,) = [w for w in ran.writes if isinstance(w, ConsumeBudget)]
    assert spend.ask.spent == 800 and spend.charge.amount == 300  # 1,100: past the limit

    under = plan_admission(facts(ask(0)))
    assert under.verdict is Verdict.RESERVE  # under the limit nobody is asked
    unmeasured = plan_admission(facts(ask(0, None), request_id="apr_2"))
    assert unmeasured.verdict is Verdict.BUDGET_EXCEEDED  # what cannot be measured is refused
    observed = plan_admission(facts(ask(1000), mode="observe"))
    assert observed.would_have is not None
    assert observed.would_have["blocked_reason"] == "approval_required"


def test_over_is_refuse_or_approve_and_nothing_else() -> None:
    text = POLICY.replace("over: approve", "over: maybe")
    with pytest.raises(PolicyError) as info:
        Policy.from_yaml(text)
    assert "<string>:6: actions.refund.budget.over: must be one of refuse, approve" in str(
        info.value
    )
    refuse = Policy.from_yaml(POLICY).budget("payout")
    assert refuse is not None and refuse.over == "refuse"


def refund(control: Control, payment: str, amount: int, approval: str | None = None) -> None:
    action = Action("refund", {"payment_id": payment, "amount": amount}, Principal("bot"))
    control.execute(action, lambda: None, f"refund:{payment}", approval_id=approval)


def spent(store: SQLiteStateStore, action: str = "refund") -> int:
    with store.reading() as conn:
        rows = conn.exec_driver_sql(
            "SELECT coalesce(sum(spent), 0) FROM budgets WHERE action = ?", (action,)
        )
        return int(rows.scalar() or 0)


def test_a_sqlite_ledger_asks_past_the_limit_and_the_approved_request_runs(
    tmp_path: Path,
) -> None:
    store = SQLiteStateStore(tmp_path / "state.db")
    control = Control(Policy.from_yaml(POLICY), store)
    refund(control, "p1", 900)
    with pytest.raises(ApprovalRequired) as info:
        refund(control, "p2", 300)
    request_id = info.value.request_id
    assert spent(store) == 900  # asking spends nothing
    with store.transaction() as conn:
        answer(conn, request_id, grant=True, approver="alice", now=utc_now())

    with pytest.raises(ApprovalMismatch, match="mismatch"):
        refund(control, "p3", 300, request_id)  # it covers exactly the action it was asked for
    refund(control, "p2", 300)  # the identical request, re-sent: runs
    assert spent(store) == 1200  # spent past the limit, as approved
    with pytest.raises(ApprovalRequired):
        refund(control, "p3", 1)  # the next one past the limit asks again

    payout = Action("payout", {"payout_id": "o1", "amount": 1001}, Principal("bot"))
    with pytest.raises(BudgetExceeded):  # over: refuse (the default) still refuses
        control.execute(payout, lambda: None, "payout:o1")
    store.close()


def test_budgets_says_what_happens_past_the_limit(tmp_path: Path) -> None:
    store = SQLiteStateStore(tmp_path / "state.db")
    control = Control(Policy.from_yaml(POLICY), store)
    refund(control, "p1", 900)
    store.close()
    (tmp_path / "ctrlrun.yaml").write_text(POLICY, encoding="utf-8")
    args = ["budgets", "--store-url", f"sqlite:///{tmp_path / 'state.db'}"]
    shown = run_cli(args, tmp_path)
    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    assert any(ln.startswith("refund  agent:bot") and "an operator is asked" in ln for ln in lines)
    assert any(ln.startswith("payout  (none yet)") and "past it: refused" in ln for ln in lines)
    rows = [json.loads(ln) for ln in run_cli([*args, "--json"], tmp_path).out.splitlines()]
    assert {r["action"]: r["over"] for r in rows} == {"refund": "approve", "payout": "refuse"}


def test_an_ambiguous_effect_resolved_failed_gives_its_amount_back(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    store = SQLiteStateStore(db)
    control = Control(Policy.from_yaml(POLICY), store)
    for payment, amount in (("p1", 600), ("p2", 300)):
        action = Action("refund", {"payment_id": payment, "amount": amount}, Principal("bot"))
        attempt = control.begin(action, f"refund:{payment}")
        control.finish(attempt, "ambiguous", error="reply lost")
    assert spent(store) == 900  # ambiguous: it may have happened, it keeps its amount

    url = f"sqlite:///{db}"
    ran = run_cli(
        ["resolve", "refund:p1", "--failed", "--as", "alice", "--store-url", url], tmp_path
    )
    assert ran.code == 0, ran.err
    assert spent(store) == 300  # resolved failed: its 600 is given back
    resolved = [d for t, d in events(store, "refund:p1") if t == "EFFECT_RESOLVED"]
    assert resolved[-1]["budget_returned"] == 600
    ran = run_cli(["resolve", "refund:p2", "--committed", "--store-url", url], tmp_path)
    assert ran.code == 0, ran.err
    assert spent(store) == 300  # committed: it keeps it

    refund(control, "p1", 600)  # the retry the failure permits spends again, once
    assert spent(store) == 900
    store.close()


def test_a_reconciler_that_finds_nothing_gives_the_amount_back(tmp_path: Path) -> None:
    store = SQLiteStateStore(tmp_path / "state.db")
    control = Control(Policy.from_yaml(POLICY), store)
    action = Action("refund", {"payment_id": "p1", "amount": 700}, Principal("bot"))
    attempt = control.begin(action, "refund:p1")
    control.finish(attempt, "ambiguous", error="reply lost")
    assert spent(store) == 700
    control.reconciler.run("refund:p1", lambda key: "not_executed", trigger="eager")
    assert spent(store) == 0
    control.reconciler.run("refund:p1", lambda key: "not_executed", trigger="eager")
    assert spent(store) == 0  # once: the record is failed, nothing more to give back

    # An attempt whose lease ran out (a crash) is ambiguous; resolved failed, it gives back.
    lost = control.begin(action, "refund:p9", lease=timedelta(milliseconds=1))
    assert lost.held and spent(store) == 700
    later = Control(Policy.from_yaml(POLICY), store, clock=lambda: utc_now() + timedelta(hours=1))
    assert later.reconciler.expire_leases() == ["refund:p9"]
    later.resolve("refund:p9", "failed", resolved_by="alice")
    assert spent(store) == 0
    store.close()
