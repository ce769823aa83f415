"""``@protect`` on ``async def`` functions, including 100 concurrent tasks on one key."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sdk_support import receipts

from ctrlrun import (
    ActionDenied,
    AmbiguousEffect,
    Control,
    DuplicateEffect,
    EffectState,
    NotExecuted,
    SQLiteStateStore,
    context,
    idempotency_token,
    protect,
)
from ctrlrun import ledger as L


def state_of(store: SQLiteStateStore, key: str) -> EffectState | None:
    with store.reading() as conn:
        rec = L.get_effect(conn, key)
    return None if rec is None else rec.state


@pytest.mark.timeout(60)
def test_hundred_tasks_one_execution(control: Control, store: SQLiteStateStore) -> None:
    executions: list[str] = []

    @protect("refund", control=control)
    async def refund(payment_id: str, amount: int) -> str:
        executions.append(idempotency_token())
        await asyncio.sleep(0.3)  # hold the key while the others arrive
        return "refunded"

    async def main() -> list[Any]:
        with context("bot"):
            tasks = [refund("p1", 100) for _ in range(100)]
            return await asyncio.wait_for(
                asyncio.gather(*tasks, return_exceptions=True), timeout=45
            )

    results = asyncio.run(main())
    assert len(executions) == 1
    assert results.count("refunded") == 1
    refused = [r for r in results if r != "refunded"]
    assert len(refused) == 99
    assert all(isinstance(r, DuplicateEffect) for r in refused), {type(r) for r in refused}
    assert {r.state for r in refused} <= {"in_progress", "committed"}
    assert state_of(store, "refund:p1") is EffectState.COMMITTED
    results_by_kind = [r["result"] for r in receipts(store)]
    assert results_by_kind.count("committed") == 1 and results_by_kind.count("blocked") == 99


def test_async_outcomes(control: Control, store: SQLiteStateStore) -> None:
    @protect("refund", control=control)
    async def refund(payment_id: str, amount: int) -> str:
        await asyncio.sleep(0)
        if payment_id == "declined":
            raise NotExecuted("declined before sending")
        if payment_id == "lost":
            raise TimeoutError("no reply")
        return idempotency_token()

    async def main() -> None:
        with context("bot"):
            token = await refund("ok", 1)
            assert len(token) == 36
            with pytest.raises(NotExecuted):
                await refund("declined", 1)
            with pytest.raises(TimeoutError):
                await refund("lost", 1)
            with pytest.raises(AmbiguousEffect):
                await refund("lost", 1)
        with pytest.raises(ActionDenied) as info:
            await refund("ok", 1)
        assert info.value.reason == "no_principal"

    asyncio.run(main())
    assert state_of(store, "refund:ok") is EffectState.COMMITTED
    assert state_of(store, "refund:declined") is EffectState.FAILED
    assert state_of(store, "refund:lost") is EffectState.AMBIGUOUS


def test_cancelled_task_is_recorded_ambiguous(control: Control, store: SQLiteStateStore) -> None:
    started = asyncio.Event()

    @protect("refund", control=control)
    async def refund(payment_id: str, amount: int) -> None:
        started.set()
        await asyncio.sleep(30)

    async def main() -> None:
        with context("bot"):
            task = asyncio.create_task(refund("p1", 1))
            await asyncio.wait_for(started.wait(), timeout=10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    assert state_of(store, "refund:p1") is EffectState.AMBIGUOUS
    assert receipts(store)[-1]["error"] == "CancelledError"


def test_async_eager_reconcile(control: Control, store: SQLiteStateStore) -> None:
    answers: list[str] = []

    def ask(key: str) -> str:
        answers.append(key)
        return "committed"

    @protect("refund", reconcile=ask, reconcile_eagerly=True, control=control)
    async def refund(payment_id: str, amount: int) -> None:
        raise TimeoutError("lost")

    async def main() -> None:
        with context("bot"):
            with pytest.raises(TimeoutError):
                await refund("p1", 1)
            with pytest.raises(DuplicateEffect):
                await refund("p1", 1)

    asyncio.run(main())
    assert answers == ["refund:p1"]
    assert state_of(store, "refund:p1") is EffectState.COMMITTED


def test_cancelled_while_reserving_is_released_not_left_executing(
    control: Control, store: SQLiteStateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reservation's thread finishes after the caller gave up: the key is released."""
    import threading

    in_begin, let_go = threading.Event(), threading.Event()
    real_begin = Control.begin

    def slow_begin(self: Control, *args: Any, **kwargs: Any) -> Any:
        attempt = real_begin(self, *args, **kwargs)  # the key is taken...
        in_begin.set()
        let_go.wait(10)  # ...and the caller is cancelled before it hears so
        return attempt

    monkeypatch.setattr(Control, "begin", slow_begin)
    ran: list[str] = []

    @protect("refund", control=control)
    async def refund(payment_id: str, amount: int) -> None:
        ran.append(payment_id)

    async def main() -> None:
        with context("bot"):
            task = asyncio.create_task(refund("p1", 1))
            await asyncio.to_thread(in_begin.wait, 10)
            task.cancel()
            await asyncio.sleep(0.05)
            task.cancel()  # a second cancellation while it waits changes nothing
            let_go.set()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    assert ran == []
    assert state_of(store, "refund:p1") is EffectState.FAILED
    last = receipts(store)[-1]
    assert last["result"] == "failed" and last["error"] == "not started: CancelledError"
    monkeypatch.undo()

    async def retry() -> None:
        with context("bot"):
            await refund("p1", 1)

    asyncio.run(retry())  # nothing ran, so the retry may
    assert ran == ["p1"] and state_of(store, "refund:p1") is EffectState.COMMITTED


@pytest.mark.timeout(30)
def test_cancelled_while_waiting_for_approval_stops_waiting(
    make_control: Any, store: SQLiteStateStore
) -> None:
    import time

    control = make_control(
        "schema: ctrlrun.policy/v2\nactions:\n  wire: {effect: 'w:{n}', decision: approve}\n"
    )

    @protect("wire", wait=True, control=control)
    async def wire(n: int) -> None:
        raise AssertionError("ran without approval")

    async def main() -> float:
        with context("bot"):
            task = asyncio.create_task(wire(1))
            await asyncio.sleep(0.3)  # now polling for a human
            started = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return time.monotonic() - started

    waited = asyncio.run(main())
    assert waited < 5  # the poll stops at its next round, not after the approval's 15 min
    assert state_of(store, "w:1") is None
