"""The admission plan, checked against an independent model (``admission_model.py``).

Hypothesis draws every input the plan depends on (record state, lease, window, approval
status, hash and expiry, mode, decision, key or none, whether a hook may be asked); two
exhaustive sweeps cover every combination of the record-side and the approval-side inputs.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from admission_model import (
    AGES,
    DECISIONS,
    EXPIRIES,
    LEASES,
    MODES,
    RECORDS,
    STATUSES,
    Expect,
    Scenario,
    expect,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from ctrlrun import (
    Action,
    ActionDenied,
    ActionFrozen,
    AmbiguousEffect,
    ApprovalMismatch,
    ApprovalRequired,
    DuplicateEffect,
    Principal,
)
from ctrlrun.action import iso
from ctrlrun.admission import attempt_of, plan_admission, wants_approval_row
from ctrlrun.plan import (
    Facts,
    InsertApproval,
    InsertEffect,
    MoveApproval,
    MoveEffect,
    Plan,
    Verdict,
)
from ctrlrun.policy import Decision, Evaluation
from ctrlrun.states import EffectRecord, EffectState

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
WINDOW = timedelta(minutes=10)
LEASE = timedelta(minutes=5)
ACTION = Action("refund", {"payment_id": "p1", "amount": 5}, Principal("bot"))
LEASE_ENDS = {
    "live": NOW + timedelta(seconds=30),
    "ends_now": NOW,
    "expired": NOW - timedelta(milliseconds=1),
    "none": None,
}
AGE = {"inside": WINDOW - timedelta(seconds=1), "at_window": WINDOW, "past": WINDOW * 2}
EXPIRY = {"future": timedelta(minutes=1), "now": timedelta(0), "past": -timedelta(seconds=1)}


def facts(s: Scenario) -> Facts:
    """The kernel's inputs for a model scenario."""
    record = None
    if s.keyed and s.record is not None:
        record = EffectRecord(
            effect_key="refund:p1",
            state=EffectState(s.record),
            action_id="act_holder",
            attempt=s.attempt,
            lease_expires_at=LEASE_ENDS[s.lease],
            created_at=NOW - timedelta(hours=1),
            updated_at=NOW - AGE[s.age],
            committed_at=NOW - AGE[s.age] if s.record == "committed" else None,
        )
    row = None
    if s.status is not None:
        row = {
            "approval_id": "apr_presented",
            "action_hash": ACTION.hash if s.same_hash else "sha256:" + "0" * 64,
            "status": s.status,
            "approver": "cli:human",
            "expires_at": iso(NOW + EXPIRY[s.expiry]),
        }
    return Facts(
        action=ACTION,
        effect_key="refund:p1" if s.keyed else None,
        evaluation=Evaluation(Decision(s.decision), "decision"),
        now=NOW,
        lease=LEASE,
        policy_hash="sha256:policy",
        mode="observe" if s.mode == "observe" else "enforce",
        window=WINDOW if s.window else None,
        record=record,
        approval_id="apr_presented" if s.presented else None,
        approval=row if s.presented else None,
        may_reconcile=s.may_reconcile,
        announced=s.announced,
        request_id="apr_requested",
    )


OUTCOME = {
    Verdict.DENY: "denied",
    Verdict.NEEDS_APPROVAL: "approval_required",
    Verdict.DUPLICATE: "duplicate",
    Verdict.IN_PROGRESS: "in_progress",
    Verdict.AMBIGUOUS: "ambiguous",
    Verdict.RECONCILE_FIRST: "reconcile_first",
    Verdict.RUN: "run",
}


def observed(s: Scenario, f: Facts, plan: Plan) -> Expect:
    """What a plan does, in the model's terms: its writes applied to the scenario's rows."""
    if plan.verdict is Verdict.RESERVE:
        outcome = f"reserve:{plan.attempt}"
    elif plan.verdict is Verdict.APPROVAL_INVALID:
        assert plan.refusal is not None
        why = plan.refusal.reason
        outcome = "approval_denied" if why == "approval_denied" else f"approval_mismatch:{why}"
    else:
        outcome = OUTCOME[plan.verdict]
    record = None if f.record is None else (f.record.state.value, f.record.attempt)
    holder = None if f.record is None else f.record.action_id
    approval = s.status if s.presented else None
    for write in plan.writes:
        if isinstance(write, InsertEffect):
            assert record is None
            record, holder = (write.values["state"], write.values["attempt"]), ACTION.action_id
        elif isinstance(write, MoveEffect):
            # A compare-and-set must name the row exactly as it was read.
            assert record == (write.old.value, write.attempt) and holder == write.action_id
            record = (write.new.value, write.values.get("attempt", write.attempt))
            holder = write.values.get("action_id", holder)
        elif isinstance(write, MoveApproval):
            assert write.approval_id == "apr_presented" and approval == write.old
            approval = write.new
        elif isinstance(write, InsertApproval):
            assert write.values["approval_id"] == "apr_requested"
            assert write.values["status"] == "pending"
            approval = "new"
    return Expect(
        outcome,
        tuple(e.type.value for e in plan.events),
        None if plan.receipt is None else plan.receipt.result,
        record,
        approval,
        None if plan.would_have is None else plan.would_have["blocked_reason"],
    )


ERRORS: dict[str, type[Exception]] = {
    "denied": ActionDenied,
    "approval_required": ApprovalRequired,
    "approval_denied": ActionDenied,
    "duplicate": DuplicateEffect,
    "in_progress": DuplicateEffect,
    "ambiguous": AmbiguousEffect,
}


def check(s: Scenario) -> None:
    f = facts(s)
    plan = plan_admission(f)
    want = expect(s)
    assert observed(s, f, plan) == want, s
    assert plan_admission(f) == plan  # pure: the same facts, the same plan
    error_type = ERRORS.get(want.outcome.split(":")[0], ApprovalMismatch)
    if plan.refusal is None:
        assert want.outcome.startswith(("reserve", "run", "reconcile_first"))
    else:
        error = plan.refusal.error("ctr_x")
        assert type(error) is error_type and error.receipt_id == "ctr_x"
        if isinstance(error, DuplicateEffect):
            assert error.state == ("committed" if want.outcome == "duplicate" else "in_progress")
    attempt = attempt_of(f, plan)
    assert attempt.held is want.outcome.startswith("reserve")
    assert attempt.held_key == (("refund:p1", plan.attempt) if attempt.held else None)
    consumed = "APPROVAL_CONSUMED" in want.events
    assert (attempt.approval is not None) is consumed
    assert (plan.approval is not None) is consumed
    # Without a record, the plan is final unless it inserts one (the writer inserts first).
    if f.record is not None:
        blind = plan_admission(replace(f, record=None))
        if not (blind.writes and isinstance(blind.writes[0], InsertEffect)):
            assert blind == plan, s
    # The writer fetches the approval row exactly when the plan reads one.
    assert wants_approval_row(f) is (
        s.presented and s.mode == "enforce" and s.decision == "approve"
    )


scenarios = st.builds(
    Scenario,
    decision=st.sampled_from(DECISIONS),
    mode=st.sampled_from(MODES),
    keyed=st.booleans(),
    record=st.sampled_from(RECORDS),
    lease=st.sampled_from(LEASES),
    attempt=st.integers(1, 3),
    window=st.booleans(),
    age=st.sampled_from(AGES),
    presented=st.booleans(),
    status=st.sampled_from(STATUSES),
    same_hash=st.booleans(),
    expiry=st.sampled_from(EXPIRIES),
    may_reconcile=st.booleans(),
    announced=st.booleans(),
)


@settings(max_examples=3000, deadline=None)
@given(scenarios)
def test_admission_matches_the_model(s: Scenario) -> None:
    check(s)


def test_every_record_side_combination() -> None:
    """All records, leases, windows and modes, with a usable approval presented or not."""
    for combo in itertools.product(
        RECORDS, LEASES, AGES, (False, True), MODES, DECISIONS, (False, True), (False, True)
    ):
        record, lease, age, window, mode, decision, reconcile, presented = combo
        check(
            Scenario(
                decision=decision,
                mode=mode,
                record=record,
                lease=lease,
                age=age,
                window=window,
                may_reconcile=reconcile,
                presented=presented,
                attempt=2,
            )
        )


def test_every_approval_side_combination() -> None:
    """All approval statuses, hashes and expiries, against a free key and a committed one."""
    for combo in itertools.product(
        STATUSES, (False, True), EXPIRIES, MODES, DECISIONS, (None, "committed"), (False, True)
    ):
        status, same, expiry, mode, decision, record, keyed = combo
        check(
            Scenario(
                decision=decision,
                mode=mode,
                record=record,
                keyed=keyed,
                presented=True,
                status=status,
                same_hash=same,
                expiry=expiry,
            )
        )


# Examples that pin the exact content of a few plans (the model checks their shape).
def test_a_new_key_is_one_insert_and_four_events() -> None:
    plan = plan_admission(facts(Scenario()))
    (insert,) = plan.writes
    assert isinstance(insert, InsertEffect)
    assert insert.values["state"] == "executing" and insert.values["attempt"] == 1
    assert insert.values["lease_expires_at"] == iso(NOW + LEASE)
    assert insert.values["action_json"] == ACTION.canonical.decode()
    reserved = plan.events[2]
    assert reserved.data == {"attempt": 1, "lease_expires_at": iso(NOW + LEASE)}
    assert plan.receipt is None and plan.refusal is None


def test_an_expired_lease_is_ambiguated_by_compare_and_set_before_the_refusal() -> None:
    plan = plan_admission(facts(Scenario(record="executing", lease="expired", attempt=3)))
    (move,) = plan.writes
    assert isinstance(move, MoveEffect)
    assert (move.old, move.new, move.action_id, move.attempt) == (
        EffectState.EXECUTING,
        EffectState.AMBIGUOUS,
        "act_holder",
        3,
    )
    assert move.values["lease_expires_at"] is None
    ambiguated = plan.events[2]
    assert ambiguated.action_id == "act_holder"  # recorded as the holder's event
    assert plan.refusal is not None and plan.refusal.action_id == "act_holder"


def test_observe_mode_records_what_enforcement_would_have_done() -> None:
    plan = plan_admission(facts(Scenario(mode="observe", decision="deny", record="committed")))
    assert plan.verdict is Verdict.RUN and not plan.writes
    assert plan.would_have == {
        "decision": "deny",
        "reason": "decision",
        "blocked_reason": "decision",
    }


@pytest.mark.parametrize(
    ("why", "message"),
    [
        ("approval_invalid", "approval apr_presented refused: mismatch"),
        ("denied", "refund denied: approval apr_presented was denied"),
    ],
)
def test_an_unusable_approval_receipt_carries_the_refusal(why: str, message: str) -> None:
    s = Scenario(decision="approve", presented=True)
    s = replace(s, same_hash=False) if why == "approval_invalid" else replace(s, status="denied")
    plan = plan_admission(facts(s))
    assert plan.receipt is not None and plan.receipt.error == message
    assert plan.receipt.approval_id == "apr_presented"
    assert plan.events[-1].data == {
        "reason": "mismatch" if why == "approval_invalid" else "approval_denied",
        "action_hash": ACTION.hash,
    }


@given(
    mode=st.sampled_from(MODES),
    decision=st.sampled_from(DECISIONS),
    record=st.sampled_from(RECORDS),
    presented=st.booleans(),
)
def test_a_freeze_refuses_before_anything_else_and_writes_nothing(
    mode: Any, decision: Any, record: Any, presented: bool
) -> None:
    s = Scenario(mode=mode, decision=decision, record=record, presented=presented)
    plan = plan_admission(replace(facts(s), frozen="every action is frozen by alice: incident"))
    assert plan.verdict is Verdict.FROZEN and plan.writes == ()  # no record, no approval spent
    assert plan.refusal is not None and plan.refusal.kind == "frozen"
    assert plan.receipt is not None and plan.receipt.result == "blocked"
    assert plan.events[-1].data == {
        "reason": "frozen",
        "detail": "every action is frozen by alice: incident",
    }
    error = plan.refusal.error("ctr_1")
    assert isinstance(error, ActionFrozen) and error.reason == "frozen"


def test_an_approval_request_needs_its_id() -> None:
    f = replace(facts(Scenario(decision="approve")), request_id=None)
    with pytest.raises(ValueError, match="request_id"):
        plan_admission(f)


def test_facts_and_plans_are_frozen() -> None:
    plan: Any = plan_admission(facts(Scenario()))
    with pytest.raises(AttributeError):
        plan.verdict = Verdict.DENY
    attempt: Any = attempt_of(facts(Scenario()), plan)
    with pytest.raises(AttributeError):
        attempt.held = False
