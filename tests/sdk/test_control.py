"""The kernel pipeline through ``Control``: decide, reserve, execute, record, reconcile, window."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sdk_support import Clock, events, monotonic_follows, receipts

from ctrlrun import (
    Action,
    ActionDenied,
    AmbiguousEffect,
    Control,
    DuplicateEffect,
    EffectState,
    InvalidArgument,
    NotExecuted,
    Principal,
    SQLiteStateStore,
    idempotency_token,
)
from ctrlrun import ledger as L
from ctrlrun.reconcile import NotAmbiguous

BOT = Principal("bot", "alice")


def act(name: str = "refund", **arguments: Any) -> Action:
    arguments.setdefault("payment_id", "p1")
    arguments.setdefault("amount", 500)
    return Action(name, arguments, BOT)


def state_of(store: SQLiteStateStore, key: str) -> tuple[EffectState, int] | None:
    with store.reading() as conn:
        rec = L.get_effect(conn, key)
    return None if rec is None else (rec.state, rec.attempt)


def test_allow_commit_then_duplicate(control: Control, store: SQLiteStateStore) -> None:
    calls: list[str] = []
    value, receipt = control.execute(act(), lambda: calls.append("run") or "done", "refund:p1")
    assert value == "done" and receipt.result == "committed" and receipt.attempt == 1
    assert receipt.decision == "allow" and receipt.decision_reason == "rule[0]"
    with pytest.raises(DuplicateEffect) as info:
        control.execute(act(), lambda: calls.append("again"), "refund:p1")
    assert info.value.state == "committed" and info.value.effect_key == "refund:p1"
    assert calls == ["run"]
    assert [t for t, _ in events(store, "refund:p1")] == [
        "ACTION_PROPOSED",
        "POLICY_EVALUATED",
        "EFFECT_RESERVED",
        "EXECUTION_STARTED",
        "EXECUTION_COMMITTED",
        "ACTION_PROPOSED",
        "POLICY_EVALUATED",
        "EFFECT_RESERVATION_REFUSED",
    ]
    assert [r["result"] for r in receipts(store)] == ["committed", "blocked"]


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        (Action("launch_missiles", {"target": "moon"}, BOT), "unknown_action"),
        (Action("delete", {"name": "prod"}, BOT), "decision"),
    ],
    ids=["unknown_action", "policy_deny"],
)
def test_denied_leaves_a_denied_receipt(
    control: Control, store: SQLiteStateStore, action: Action, reason: str
) -> None:
    with pytest.raises(ActionDenied) as info:
        control.execute(action, lambda: pytest.fail("a denied action ran"), None)
    assert info.value.reason == reason and info.value.action_id == action.action_id
    (doc,) = receipts(store)
    assert doc["result"] == "denied" and doc["decision"] == "deny"
    assert doc["decision_reason"] == reason and doc["action"] == action.name
    assert ("ACTION_DENIED", {"reason": reason}) in events(store)


def test_no_effect_key_runs_every_time(control: Control, store: SQLiteStateStore) -> None:
    for i in range(3):
        _, receipt = control.execute(Action("note", {"i": i}, BOT), lambda: "x")
        assert receipt.result == "committed" and receipt.effect_key is None
    assert state_of(store, "note") is None
    with store.reading() as conn:
        assert L.list_effects(conn) == []


def test_not_executed_fails_then_renews(control: Control, store: SQLiteStateStore) -> None:
    def refuse() -> None:
        raise NotExecuted("connection refused")

    with pytest.raises(NotExecuted):
        control.execute(act(), refuse, "refund:p1")
    assert state_of(store, "refund:p1") == (EffectState.FAILED, 1)
    _, receipt = control.execute(act(), lambda: None, "refund:p1")
    assert receipt.attempt == 2
    assert state_of(store, "refund:p1") == (EffectState.COMMITTED, 2)


@pytest.mark.parametrize("exc", [TimeoutError("lost"), RuntimeError("bug"), KeyboardInterrupt()])
def test_any_other_exception_is_ambiguous(
    control: Control, store: SQLiteStateStore, exc: BaseException
) -> None:
    def boom() -> None:
        raise exc

    with pytest.raises(type(exc)):
        control.execute(act(), boom, "refund:p1")
    assert state_of(store, "refund:p1") == (EffectState.AMBIGUOUS, 1)
    assert receipts(store)[-1]["error"].startswith(type(exc).__name__)
    with pytest.raises(AmbiguousEffect) as info:
        control.execute(act(), lambda: pytest.fail("ran over an ambiguous effect"), "refund:p1")
    assert "ctrlrun resolve refund:p1" in str(info.value)


class Hook:
    """A reconcile hook that counts its calls and answers from a script."""

    def __init__(self, answer: Callable[[], Any]) -> None:
        self.answer = answer
        self.calls: list[str] = []

    def __call__(self, key: str) -> Any:
        self.calls.append(key)
        return self.answer()


def make_ambiguous(control: Control, key: str = "refund:p1") -> None:
    def lost() -> None:
        raise TimeoutError("no reply")

    with pytest.raises(TimeoutError):
        control.execute(act(), lost, key)


def _raise() -> Any:
    raise ConnectionError("stripe unreachable")


# (id, hook answer, recorded RECONCILIATION_RESOLVED data)
GARBAGE: list[tuple[str, Callable[[], Any], dict[str, Any]]] = [
    (
        "raises",
        _raise,
        {"outcome": "unknown", "reason": "raised", "error": "ConnectionError: stripe unreachable"},
    ),
    (
        "returns_none",
        lambda: None,
        {"outcome": "unknown", "reason": "invalid_return", "error": "None"},
    ),
    (
        "returns_bad_string",
        lambda: "COMMITTED",
        {"outcome": "unknown", "reason": "invalid_return", "error": "'COMMITTED'"},
    ),
    (
        "returns_bool",
        lambda: True,
        {"outcome": "unknown", "reason": "invalid_return", "error": "True"},
    ),
    ("unknown", lambda: "unknown", {"outcome": "unknown"}),
]


@pytest.mark.parametrize("eager", [False, True], ids=["lazy", "eager"])
@pytest.mark.parametrize(("answer", "data"), [g[1:] for g in GARBAGE], ids=[g[0] for g in GARBAGE])
def test_hook_without_an_answer_leaves_record_ambiguous(
    control: Control,
    store: SQLiteStateStore,
    eager: bool,
    answer: Callable[[], Any],
    data: dict[str, Any],
) -> None:
    hook = Hook(answer)

    def lost() -> None:
        raise TimeoutError("no reply")

    with pytest.raises(TimeoutError):
        control.execute(act(), lost, "refund:p1", reconcile=hook, reconcile_eagerly=eager)
    assert len(hook.calls) == (1 if eager else 0)
    with pytest.raises(AmbiguousEffect):
        control.execute(act(), lambda: pytest.fail("ran"), "refund:p1", reconcile=hook)
    assert hook.calls == ["refund:p1"] * (2 if eager else 1)
    assert state_of(store, "refund:p1") == (EffectState.AMBIGUOUS, 1)
    evs = events(store, "refund:p1")
    resolved = [d for t, d in evs if t == "RECONCILIATION_RESOLVED"]
    started = [d for t, d in evs if t == "RECONCILIATION_STARTED"]
    assert resolved == [data] * len(hook.calls)
    triggers = ["eager", "blocking"] if eager else ["blocking"]
    assert started == [{"effect_key": "refund:p1", "trigger": t} for t in triggers]
    assert "EFFECT_RESOLVED" not in [t for t, _ in evs]


def test_lazy_reconcile_at_most_one_call_per_attempt(
    control: Control, store: SQLiteStateStore
) -> None:
    make_ambiguous(control)
    hook = Hook(lambda: "unknown")
    for n in range(1, 4):
        with pytest.raises(AmbiguousEffect):
            control.execute(act(), lambda: pytest.fail("ran"), "refund:p1", reconcile=hook)
        assert len(hook.calls) == n
    assert [r["result"] for r in receipts(store)] == ["ambiguous"] + ["blocked"] * 3


def test_lazy_reconcile_committed_means_duplicate(
    control: Control, store: SQLiteStateStore
) -> None:
    make_ambiguous(control)
    hook = Hook(lambda: "committed")
    with pytest.raises(DuplicateEffect) as info:
        control.execute(act(), lambda: pytest.fail("ran"), "refund:p1", reconcile=hook)
    assert info.value.state == "committed" and len(hook.calls) == 1
    assert state_of(store, "refund:p1") == (EffectState.COMMITTED, 1)
    assert (
        "EFFECT_RESOLVED",
        {"state": "committed", "resolved_by": "reconcile", "resolver": "reconcile"},
    ) in events(store)


def test_lazy_reconcile_not_executed_lets_the_retry_run(
    control: Control, store: SQLiteStateStore
) -> None:
    tokens: list[str] = []

    def lost() -> None:
        tokens.append(idempotency_token())
        raise TimeoutError("no reply")

    with pytest.raises(TimeoutError):
        control.execute(act(), lost, "refund:p1")
    hook = Hook(lambda: "not_executed")
    _, receipt = control.execute(
        act(), lambda: tokens.append(idempotency_token()), "refund:p1", reconcile=hook
    )
    assert len(hook.calls) == 1
    assert receipt.result == "committed" and receipt.attempt == 2
    assert len(tokens) == 2 and tokens[0] != tokens[1]
    assert state_of(store, "refund:p1") == (EffectState.COMMITTED, 2)
    resolved = [d for t, d in events(store) if t == "RECONCILIATION_RESOLVED"]
    assert resolved == [{"outcome": "not_executed"}]


def test_lease_expiry_triggers_lazy_reconcile(
    make_control: Callable[..., Control], store: SQLiteStateStore, clock: Clock
) -> None:
    control = make_control(lease=timedelta(seconds=5))
    holder = control.begin(act(), "refund:p1")
    clock.advance(seconds=6)
    hook = Hook(lambda: "not_executed")
    _, receipt = control.execute(act(), lambda: "ran", "refund:p1", reconcile=hook)
    assert hook.calls == ["refund:p1"] and receipt.attempt == 2
    assert control.finish(holder, "committed").result == "ambiguous"
    assert state_of(store, "refund:p1") == (EffectState.COMMITTED, 2)


def test_human_resolution(control: Control, store: SQLiteStateStore) -> None:
    with pytest.raises(NotAmbiguous, match="nobody reserved"):
        control.resolve("refund:p1", "failed")
    make_ambiguous(control)
    with pytest.raises(InvalidArgument):
        control.resolve("refund:p1", "executing")
    control.resolve("refund:p1", "failed")
    with pytest.raises(NotAmbiguous, match="is not ambiguous"):
        control.resolve("refund:p1", "committed")
    with store.reading() as conn:
        rec = L.get_effect(conn, "refund:p1")
    assert rec is not None and rec.state is EffectState.FAILED and rec.resolved_by == "cli:local"
    _, receipt = control.execute(act(), lambda: None, "refund:p1")
    assert receipt.attempt == 2


def test_window_reserves_again_after_it_passes(
    control: Control, store: SQLiteStateStore, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monotonic_follows(clock, monkeypatch)  # time passes, not only the wall clock
    key = "scale:prod:checkout:6"
    scale = Action("scale", {"cluster": "prod", "deployment": "checkout", "replicas": 6}, BOT)
    runs: list[int] = []
    start = clock.now
    _, first = control.execute(scale, lambda: runs.append(1), key)
    assert first.attempt == 1
    for offset in (timedelta(0), timedelta(minutes=9, seconds=59)):
        clock.now = start + offset
        with pytest.raises(DuplicateEffect) as info:
            control.execute(scale, lambda: runs.append(99), key)
        assert info.value.state == "committed"
    clock.now = start + timedelta(minutes=10)
    _, second = control.execute(scale, lambda: runs.append(2), key)
    assert second.attempt == 2 and runs == [1, 2]
    with pytest.raises(DuplicateEffect):
        control.execute(scale, lambda: runs.append(99), key)
    clock.advance(minutes=10, seconds=1)
    _, third = control.execute(scale, lambda: runs.append(3), key)
    assert third.attempt == 3 and runs == [1, 2, 3]


def test_no_window_blocks_forever(control: Control, clock: Clock) -> None:
    control.execute(act(), lambda: None, "refund:p1")
    clock.advance(days=3650)
    with pytest.raises(DuplicateEffect):
        control.execute(act(), lambda: None, "refund:p1")


def test_observe_mode_runs_and_records_what_would_have_happened(
    make_control: Callable[..., Control], store: SQLiteStateStore
) -> None:
    control = make_control(
        "schema: ctrlrun.policy/v2\nmode: observe\nactions:\n  delete: {decision: deny}\n"
    )
    value, receipt = control.execute(Action("delete", {"name": "x"}, BOT), lambda: "ran")
    assert value == "ran" and receipt.result == "observed"
    assert receipt.would_have == {
        "decision": "deny",
        "reason": "decision",
        "blocked_reason": "decision",
    }


@pytest.mark.parametrize(
    "kwargs",
    [{"lease": timedelta(0)}, {"lease": timedelta(seconds=-1)}, {"approval_ttl": timedelta(0)}],
)
def test_control_refuses_non_positive_durations(
    make_control: Callable[..., Control], kwargs: dict[str, Any]
) -> None:
    with pytest.raises(InvalidArgument):
        make_control(**kwargs)
