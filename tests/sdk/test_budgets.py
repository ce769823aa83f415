"""Budgets: the plan (pure), the policy's ``budget:`` key, and spending on a SQLite ledger."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from ctrlrun import (
    Action,
    ActionDenied,
    BudgetExceeded,
    Control,
    NotExecuted,
    Policy,
    PolicyError,
    Principal,
    SQLiteStateStore,
)
from ctrlrun.admission import attempt_of, plan_admission
from ctrlrun.budgets import Budget, BudgetAsk
from ctrlrun.cli import main as cli_main
from ctrlrun.plan import ConsumeBudget, Facts, InsertEffect, Verdict
from ctrlrun.policy import Decision, Evaluation

ALLOW = Evaluation(Decision.ALLOW, "decision")
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ACTION = Action("refund", {"payment_id": "p1", "amount": 300}, Principal("bot", "u1"))
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  refund:
    effect: "refund:{payment_id}"
    decision: allow
    budget: {sum: amount, max: 1000, per: 1d, by: agent}
  ping:
    decision: allow
    budget: {count: true, max: 2, per: 1h, by: everyone}
"""


def ask(spent: int | None, charge: int | None = 300, max_: int = 1000) -> BudgetAsk:
    return BudgetAsk("refund", "agent:bot", "2026-03-01T00:00:00.000000Z", max_, charge, spent)


def facts(
    budget: BudgetAsk | None,
    *,
    key: str | None = "refund:p1",
    evaluation: Evaluation = ALLOW,
    **kw: object,
) -> Facts:
    return Facts(
        action=ACTION,
        effect_key=key,
        evaluation=evaluation,
        now=NOW,
        lease=timedelta(minutes=5),
        policy_hash="sha256:x",
        budget=budget,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("key", ["refund:p1", None])
def test_a_plan_under_the_limit_spends_with_a_compare_and_set(key: str | None) -> None:
    f = facts(ask(700), key=key)
    plan = plan_admission(f)
    assert plan.verdict is (Verdict.RESERVE if key else Verdict.RUN)
    spend = [w for w in plan.writes if isinstance(w, ConsumeBudget)]
    assert len(spend) == 1 and spend[0].ask.spent == 700 and spend[0].charge.amount == 300
    if key:
        assert isinstance(plan.writes[0], InsertEffect)  # the writer's fast path stays first
    assert attempt_of(f, plan).budget == spend[0].charge


@pytest.mark.parametrize(("spent", "charge"), [(701, 300), (1000, 1), (None, 1001), (0, None)])
def test_past_the_limit_or_unmeasurable_the_plan_refuses(
    spent: int | None, charge: int | None
) -> None:
    plan = plan_admission(facts(ask(spent, charge)))
    assert plan.verdict is Verdict.BUDGET_EXCEEDED and plan.writes == ()
    assert plan.receipt is not None and plan.receipt.result == "blocked"
    assert plan.refusal is not None
    error = plan.refusal.error("ctr_1")
    assert isinstance(error, BudgetExceeded) and isinstance(error, ActionDenied)
    assert error.reason == "budget_exceeded" and error.receipt_id == "ctr_1"


def test_an_action_past_its_budget_asks_no_human_and_consumes_no_approval() -> None:
    approve = Evaluation(Decision.APPROVE, "rule[1]")
    asked = plan_admission(facts(ask(1000), evaluation=approve, request_id="apr_1"))
    assert asked.verdict is Verdict.BUDGET_EXCEEDED and asked.writes == ()
    row = {"status": "granted", "action_hash": ACTION.hash, "approver": "alice"}
    presented = facts(ask(1000), evaluation=approve, approval_id="apr_1", approval=row)
    assert plan_admission(presented).writes == ()
    under = plan_admission(facts(ask(0), evaluation=approve, request_id="apr_2"))
    assert under.verdict is Verdict.NEEDS_APPROVAL


def test_observe_mode_spends_nothing_and_says_what_it_would_have_done() -> None:
    over = plan_admission(facts(ask(1000), mode="observe"))
    assert over.verdict is Verdict.RESERVE and over.refusal is None
    assert over.would_have is not None and over.would_have["blocked_reason"] == "budget_exceeded"
    under = plan_admission(facts(ask(0), mode="observe"))
    assert not [w for w in under.writes if isinstance(w, ConsumeBudget)]


def test_the_charge_counts_an_integer_argument_and_nothing_else() -> None:
    b = Budget(10, timedelta(days=1), "agent", "amount")
    assert [b.charge({"amount": v}) for v in (5, "5", "0010", 0)] == [5, 5, 10, 0]
    for bad in (
        {},
        {"amount": -1},
        {"amount": True},
        {"amount": "1e3"},
        {"amount": "-5"},
        {"amount": 2.5},
        {"amount": "５"},
        {"amount": None},
    ):
        assert b.charge(bad) is None, bad
    assert Budget(10, timedelta(days=1), "agent").charge({}) == 1
    day = b.window_start(NOW + timedelta(hours=11, minutes=59))
    assert day == datetime(2026, 3, 1, tzinfo=UTC)
    assert b.scope(Principal("a", "u")) == "agent:a"
    assert Budget(1, timedelta(1), "user").scope(Principal("a")) == "user:"
    assert Budget(1, timedelta(1), "everyone").scope(Principal("a")) == "*"


@pytest.mark.parametrize(
    ("budget", "says"),
    [
        ("{max: 5, per: 1d}", "needs exactly one of sum: ARGUMENT or count: true"),
        ("{sum: amount, count: true, max: 5, per: 1d}", "needs exactly one of"),
        ("{count: false, max: 5, per: 1d}", "count: must be true"),
        ("{sum: 3, max: 5, per: 1d}", "sum: must name an argument"),
        ("{sum: amount, max: -1, per: 1d}", "max: must be a whole number"),
        ("{sum: amount, max: 5, per: soon}", "per: must be a duration"),
        ("{sum: amount, max: 5, per: 1d, by: team}", "by:"),
        ("{sum: amount, per: 1d}", "max"),
        ("{sum: amount, max: 5, per: 1d, cap: 3}", "cap"),
        ("5", "budget"),
    ],
)
def test_a_bad_budget_is_one_clear_line(budget: str, says: str) -> None:
    head = "schema: ctrlrun.policy/v2\nactions:\n  refund:\n    decision: allow\n"
    text = f"{head}    budget: {budget}\n"
    with pytest.raises(PolicyError) as info:
        Policy.from_yaml(text)
    message = str(info.value)
    assert "\n" not in message and says in message and "<string>:5" in message


def test_budget_needs_schema_v2() -> None:
    budget = "{count: true, max: 1, per: 1d}"
    text = f"schema: ctrlrun.policy/v1\nactions:\n  r: {{decision: allow, budget: {budget}}}\n"
    with pytest.raises(PolicyError, match="needs schema"):
        Policy.from_yaml(text)


def test_a_sqlite_ledger_spends_refuses_and_gives_back_a_failure(tmp_path: Path) -> None:
    store = SQLiteStateStore(tmp_path / "state.db")
    control = Control(Policy.from_yaml(POLICY), store)
    bot = Principal("bot")

    def refund(payment: str, amount: object, who: Principal = bot) -> None:
        action = Action("refund", {"payment_id": payment, "amount": amount}, who)
        control.execute(action, lambda: None, f"refund:{payment}")

    refund("p1", 600)
    refund("p2", 400)
    with pytest.raises(BudgetExceeded, match="0 left, this asks 1") as info:
        refund("p3", 1)
    assert info.value.receipt_id is not None
    with pytest.raises(BudgetExceeded, match="cannot measure"):
        refund("p4", "all")
    refund("p5", 1000, Principal("other"))  # by: agent: another agent has its own

    def fails() -> None:
        raise NotExecuted("declined before sending")

    ping = Action("ping", {}, bot)
    with pytest.raises(NotExecuted):
        control.execute(ping, fails)  # failed: its count is given back
    attempt = control.begin(Action("ping", {}, bot), None)
    control.finish(attempt, "ambiguous", error="lost")  # ambiguous: it keeps its count
    control.execute(Action("ping", {}, bot), lambda: None)
    with pytest.raises(BudgetExceeded):
        control.execute(Action("ping", {}, Principal("x")), lambda: None)  # by: everyone

    policy_file = tmp_path / "ctrlrun.yaml"
    policy_file.write_text(POLICY, encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'state.db'}"
    ran = CliRunner().invoke(
        cli_main, ["budgets", "--policy", str(policy_file), "--store-url", url]
    )
    assert ran.exit_code == 0, ran.output
    lines = ran.output.splitlines()
    assert any(line.startswith("refund  agent:bot  spent 1000, left 0 of 1000") for line in lines)
    assert any(line.startswith("refund  agent:other  spent 1000, left 0") for line in lines)
    assert any(line.startswith("ping  *  spent 2, left 0 of 2") for line in lines)
    store.close()
