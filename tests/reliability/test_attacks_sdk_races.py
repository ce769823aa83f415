"""Races around one effect key through ``@ctrlrun.protect``, on SQLite and on PostgreSQL:
threads and asyncio tasks that arrive together, and a reconcile hook whose answer arrives
after the record it was asked about has been replaced by a newer attempt."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ctrlrun import (
    AmbiguousEffect,
    Control,
    DuplicateEffect,
    EffectState,
    Policy,
    context,
    ledger,
    protect,
)
from ctrlrun.store import StateStore, open_store

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  refund:
    effect: "refund:{payment_id}"
    decision: allow
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'state.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    store = open_store(url)
    yield store
    store.close()


def record(store: StateStore, key: str) -> tuple[EffectState, int]:
    with store.reading() as conn:
        rec = ledger.get_effect(conn, key)
    assert rec is not None
    return rec.state, rec.attempt


@pytest.mark.timeout(120)
def test_threads_racing_on_one_key_run_it_once(ledger_store: StateStore) -> None:
    ctl = Control(Policy.from_yaml(POLICY), ledger_store)
    runs: list[str] = []
    inside = threading.Barrier(12, timeout=30)

    @protect("refund", control=ctl)
    def refund(payment_id: str) -> str:
        runs.append(payment_id)
        return "refunded"

    def one(_: int) -> Any:
        with context("bot"):
            inside.wait()  # all twelve ask at once
            try:
                return refund("pi_race")
            except DuplicateEffect as exc:
                return exc.state

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(one, range(12), timeout=90))
    assert runs == ["pi_race"]
    assert answers.count("refunded") == 1
    assert set(answers) - {"refunded"} <= {"in_progress", "committed"}
    assert record(ledger_store, "refund:pi_race") == (EffectState.COMMITTED, 1)


@pytest.mark.timeout(120)
def test_tasks_racing_on_one_key_run_it_once(ledger_store: StateStore) -> None:
    ctl = Control(Policy.from_yaml(POLICY), ledger_store)
    runs: list[str] = []

    @protect("refund", control=ctl)
    async def refund(payment_id: str) -> str:
        runs.append(payment_id)
        await asyncio.sleep(0.2)
        return "refunded"

    async def main() -> list[Any]:
        with context("bot"):
            calls = [refund("pi_tasks") for _ in range(30)]
            return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 90)

    answers = asyncio.run(main())
    assert runs == ["pi_tasks"]
    assert answers.count("refunded") == 1
    assert all(isinstance(a, DuplicateEffect) for a in answers if a != "refunded"), answers
    assert record(ledger_store, "refund:pi_tasks") == (EffectState.COMMITTED, 1)


@pytest.mark.timeout(120)
def test_a_late_answer_about_an_old_attempt_does_not_settle_a_newer_one(
    ledger_store: StateStore,
) -> None:
    """Two callers meet the same ambiguous attempt 1 and each asks its hook. A hears
    ``not_executed`` first, renews, and its attempt 2 acts and ends ambiguous. B's hook, which
    looked at the remote before attempt 2 reached it, then answers ``not_executed`` too: that
    is about attempt 1, and must not fail attempt 2 (B would run the effect a third time)."""
    ctl = Control(Policy.from_yaml(POLICY), ledger_store)
    acted: list[str] = []
    b_asking, b_may_answer = threading.Event(), threading.Event()

    def hook_a(key: str) -> str:
        return "not_executed"

    def hook_b(key: str) -> str:
        b_asking.set()
        assert b_may_answer.wait(60)
        return "not_executed"  # what the remote said when B looked: before attempt 2

    def body(payment_id: str) -> None:
        acted.append(payment_id)
        raise ConnectionError("reply lost")  # the remote acted; nobody heard

    first = protect("refund", control=ctl)(body)
    via_a = protect("refund", control=ctl, reconcile=hook_a)(body)
    via_b = protect("refund", control=ctl, reconcile=hook_b)(body)

    def caller_b() -> Any:
        with context("agent-b"):
            try:
                return via_b("pi_late")
            except Exception as exc:
                return exc

    with context("agent-a"):
        with pytest.raises(ConnectionError):
            first("pi_late")  # attempt 1: ambiguous
        with ThreadPoolExecutor(1) as pool:
            b = pool.submit(caller_b)
            assert b_asking.wait(30)
            with pytest.raises(ConnectionError):
                via_a("pi_late")  # attempt 2: renewed on A's answer, acted, ambiguous
            assert record(ledger_store, "refund:pi_late") == (EffectState.AMBIGUOUS, 2)
            b_may_answer.set()
            answer_b = b.result(timeout=60)
    assert isinstance(answer_b, AmbiguousEffect), answer_b
    assert acted == ["pi_late", "pi_late"]
    assert record(ledger_store, "refund:pi_late") == (EffectState.AMBIGUOUS, 2)
