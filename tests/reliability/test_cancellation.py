"""Cancelling an async ``@protect`` call while its reservation is being written.

The reservation runs in a worker thread that a cancellation cannot stop: the key may be taken
after the caller has given up. A call whose function never started must then be released
(recorded ``failed``: nothing was executed), never left ``executing`` until its lease runs out.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ctrlrun import Control, EffectState, Policy, context, ledger, protect
from ctrlrun.store import StateStore, open_store

CANCELLATIONS = 300
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


def measure_reservation(control: Control) -> float:
    """How long one reservation takes here, so the cancellations land inside it."""

    @protect("refund", control=control)
    async def probe(payment_id: str, amount: int) -> None:
        return None

    async def run() -> float:
        with context("probe"):
            started = time.perf_counter()
            for i in range(20):
                await probe(f"probe-{i}", 1)
            return (time.perf_counter() - started) / 20

    return asyncio.run(run())


@pytest.mark.timeout(180)
def test_cancelled_before_start_is_never_left_executing(ledger_store: StateStore) -> None:
    control = Control(Policy.from_yaml(POLICY), ledger_store)
    per_call = measure_reservation(control)
    ran: set[int] = set()
    rng = random.Random(14)

    @protect("refund", control=control)
    async def refund(payment_id: str, amount: int) -> str:
        ran.add(int(payment_id.split("-")[1]))
        return "refunded"

    async def one(i: int) -> str:
        task = asyncio.create_task(refund(f"p-{i}", 100))
        # Anywhere from before the worker thread starts to after the reservation committed.
        await asyncio.sleep(rng.uniform(0, per_call * 1.5))
        task.cancel()
        try:
            return await asyncio.wait_for(task, timeout=30)
        except asyncio.CancelledError:
            return "cancelled"

    async def run() -> list[str]:
        with context("bot"):
            return [await one(i) for i in range(CANCELLATIONS)]

    deadline = time.monotonic() + 150
    results = asyncio.run(run())
    assert time.monotonic() < deadline
    with ledger_store.reading() as conn:
        records = {i: ledger.get_effect(conn, f"refund:p-{i}") for i in range(CANCELLATIONS)}
    never_ran = [i for i in range(CANCELLATIONS) if i not in ran]
    left = [
        i for i in never_ran if records[i] is not None and records[i].state is EffectState.EXECUTING
    ]
    taken = [i for i in never_ran if records[i] is not None]
    print(
        f"cancellations={CANCELLATIONS} reservation={per_call * 1e3:.2f}ms "
        f"cancelled={results.count('cancelled')} function_ran={len(ran)} "
        f"never_ran_but_key_taken={len(taken)} left_executing={len(left)}"
    )
    assert left == []
    # A released key is recorded as not executed, so the retry may run.
    for i in taken:
        record = records[i]
        assert record is not None and record.state is EffectState.FAILED, (i, record)
    # A function that ran was never cancelled before it started: its record says what it did.
    for i in ran:
        record = records[i]
        assert record is not None and record.state in (
            EffectState.COMMITTED,
            EffectState.AMBIGUOUS,
        )
