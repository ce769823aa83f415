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
