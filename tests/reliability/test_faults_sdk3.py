"""Faults under ``@ctrlrun.protect``: the wall clock stepping forward past a running call's
lease (threads and asyncio tasks, a retry and a sweep in the same process), and reconcile
hooks that raise, return garbage or answer for a call still running, and a step past the
settle window while Stripe is still working on a refund."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import stripe

from ctrlrun import (
    AmbiguousEffect,
    Control,
    DuplicateEffect,
    EffectState,
    Policy,
    context,
    idempotency_token,
    protect,
)
from ctrlrun.reconcilers.http import SETTLE_MARGIN
from ctrlrun.store import StateStore, open_store
from reliability.test_attacks_sdk_races import POLICY, record

LEASE = timedelta(seconds=30)


class SteppingClock:
    """A wall clock that an operator (or NTP, or a resumed VM) steps."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def step(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateStore]:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    if request.param == "postgresql":
        url = request.getfixturevalue("pg_url")
    store = open_store(url)
    yield store
    store.close()


class Remote:
    """A remote that has seen a refund only once the running call has sent it."""

    def __init__(self) -> None:
        self.refunds: list[str] = []
        self.inside = threading.Event()
        self.go = threading.Event()

    def answer(self, key: str) -> str:  # a hook with no settle window: it trusts the remote
        return "committed" if self.refunds else "not_executed"

    def refund(self, payment_id: str) -> str:
        self.inside.set()
        assert self.go.wait(30), "the test never let the call finish"
        self.refunds.append(payment_id)
        return "re_1"


def controls(store: StateStore, clock: SteppingClock, same: bool) -> tuple[Control, Control]:
    first = Control(Policy.from_yaml(POLICY), store, clock=clock, lease=LEASE)
    if same:
        return first, first
    return first, Control(Policy.from_yaml(POLICY), store, clock=clock, lease=LEASE)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("same", [True, False], ids=["one-control", "two-controls"])
def test_a_clock_step_past_the_lease_does_not_let_a_retry_in_this_process_run_again(
    ledger_store: StateStore, same: bool
) -> None:
    clock, remote = SteppingClock(), Remote()
    ctl, other = controls(ledger_store, clock, same)
    running = protect("refund", control=ctl, reconcile=remote.answer)(remote.refund)
    retry = protect("refund", control=other, reconcile=remote.answer)(remote.refund)
    results: list[Any] = []

    def agent() -> None:
        with context("bot"):
            results.append(running("pi_1"))

    thread = threading.Thread(target=agent)
    thread.start()
    try:
        assert remote.inside.wait(30)
        clock.step(LEASE.total_seconds() + 1)  # before the heartbeat's next renewal
        assert ctl.reconciler.expire_leases() == []  # a sweep here: the holder is running
        with context("bot"), pytest.raises(DuplicateEffect, match="executing"):
            retry("pi_1")
    finally:
        remote.go.set()
        thread.join(30)
    assert results == ["re_1"] and remote.refunds == ["pi_1"]
    assert record(ledger_store, "refund:pi_1") == (EffectState.COMMITTED, 1)


@pytest.mark.timeout(120)
def test_a_clock_step_past_the_lease_of_a_running_task_refuses_the_retry_task(
    ledger_store: StateStore,
) -> None:
    clock = SteppingClock()
    ctl = Control(Policy.from_yaml(POLICY), ledger_store, clock=clock, lease=LEASE)
    refunds: list[str] = []
    started, go = asyncio.Event(), asyncio.Event()

    async def refund(payment_id: str) -> str:
        started.set()
        await asyncio.wait_for(go.wait(), 30)
        refunds.append(payment_id)
        return "re_1"

    hook: Callable[[str], Any] = lambda key: "committed" if refunds else "not_executed"  # noqa: E731
    fn = protect("refund", control=ctl, reconcile=hook)(refund)

    async def scene() -> None:
        with context("bot"):
            first = asyncio.create_task(fn("pi_1"))
            await asyncio.wait_for(started.wait(), 30)
            clock.step(LEASE.total_seconds() + 1)
            with pytest.raises(DuplicateEffect, match="executing"):
                await fn("pi_1")
            go.set()
            assert await first == "re_1"

    asyncio.run(scene())
    assert refunds == ["pi_1"]
    assert record(ledger_store, "refund:pi_1") == (EffectState.COMMITTED, 1)


@pytest.mark.parametrize(
    "answer",
    [
        lambda key: "COMMITTED",
        lambda key: "committed ",
        lambda key: True,
        lambda key: None,
        lambda key: {"outcome": "not_executed"},
        lambda key: 1 / 0,
        lambda key: (_ for _ in ()).throw(TimeoutError("remote hung")),
    ],
    ids=["upper", "space", "true", "none", "dict", "raises", "timeout"],
)
def test_a_hook_that_raises_or_answers_garbage_moves_nothing_and_the_retry_is_refused(
    ledger_store: StateStore, answer: Callable[[str], Any]
) -> None:
    ctl = Control(Policy.from_yaml(POLICY), ledger_store)
    ran: list[str] = []

    @protect("refund", control=ctl, reconcile=answer, reconcile_eagerly=True)
    def refund(payment_id: str) -> None:
        ran.append(payment_id)
        raise ConnectionResetError("the reply was lost")

    with context("bot"):
        with pytest.raises(ConnectionResetError):
            refund("pi_1")
        with pytest.raises(AmbiguousEffect) as caught:
            refund("pi_1")
    assert ran == ["pi_1"] and "\n" not in str(caught.value)
    assert record(ledger_store, "refund:pi_1") == (EffectState.AMBIGUOUS, 1)


@pytest.mark.timeout(120)
def test_a_clock_step_past_the_settle_window_does_not_prove_a_slow_stripe_refund_absent(
    tmp_path: Path,
) -> None:
    """The client gives up after 1 s while Stripe works on the refund for 3 s; the wall clock
    then steps an hour, past the settle window: the retry's hook must not hear "no refund" as
    proof (Stripe's own clock says the attempt is seconds old)."""
    from e2e.harness import STRIPE_KEY

    from ctrlrun.reconcilers import stripe_refunds
    from ctrlrun.testing import FakeStripe
    from reliability.test_clocks import SDK_POLICY, wait_for

    clock = SteppingClock()
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    ctl = Control(Policy.from_yaml(SDK_POLICY), store, clock=clock)
    with FakeStripe() as fake:
        pi = fake.add_payment_intent(amount=5000)["id"]
        http = stripe.RequestsClient(timeout=1)
        client = stripe.StripeClient(
            STRIPE_KEY, base_addresses={"api": fake.url}, max_network_retries=0, http_client=http
        )
        hook = stripe_refunds(api_key=STRIPE_KEY, base_url=fake.url)

        @protect("stripe.refund", effect="refund:{payment_id}", reconcile=hook, control=ctl)
        def refund(payment_id: str, amount: int) -> str:
            params: Any = {"payment_intent": payment_id, "amount": amount}
            options: Any = {"idempotency_key": idempotency_token()}
            return str(client.v1.refunds.create(params=params, options=options).id)

        fake.delay_next(3)
        with context("bot"):
            with pytest.raises(stripe.APIConnectionError):
                refund(pi, 500)
            clock.step(SETTLE_MARGIN * 60)  # a VM resumed an hour later, while Stripe still works
            with pytest.raises(AmbiguousEffect):
                refund(pi, 500)
            wait_for(lambda: len(fake.refunds) >= 1)
            with pytest.raises(DuplicateEffect):
                refund(pi, 500)  # once Stripe has it, the retry's own ask finds it
        assert len(fake.refunds) == 1
    assert record(store, f"refund:{pi}") == (EffectState.COMMITTED, 1)
    store.close()


@pytest.mark.timeout(120)
def test_a_child_forked_after_a_call_renews_its_own_calls_lease(tmp_path: Path) -> None:
    """The parent's first call started its renewing thread; fork() copies none of it. The
    child's call, longer than its lease, must keep its key from the parent's retry."""
    import os
    import time

    lease = timedelta(seconds=1.5)
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    ctl = Control(Policy.from_yaml(POLICY), store, lease=lease)
    runs = tmp_path / "runs"
    inside_r, inside_w = os.pipe()
    go_r, go_w = os.pipe()

    @protect("refund", control=ctl)
    def refund(payment_id: str) -> None:
        if payment_id == "pi_1":
            os.write(inside_w, b"x")
            os.read(go_r, 1)  # until the parent's retry has been answered
        with runs.open("a") as f:
            f.write(payment_id + "\n")

    with context("bot"):
        refund("pi_0")  # the heartbeat's thread starts here, in the parent
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        with context("bot"):
            refund("pi_1")
        os._exit(0)
    try:
        assert os.read(inside_r, 1) == b"x"
        time.sleep(2 * lease.total_seconds())  # past the lease: only a renewal keeps the key
        other = Control(Policy.from_yaml(POLICY), store, lease=lease)
        again = protect("refund", control=other, reconcile=lambda key: "not_executed")
        with context("bot"), pytest.raises(DuplicateEffect, match="executing"):
            again(lambda payment_id: runs.open("a").write("retry\n"))("pi_1")
    finally:
        os.write(go_w, b"x")
        _, status = os.waitpid(pid, 0)
    assert status == 0 and runs.read_text().split() == ["pi_0", "pi_1"]
    assert record(store, "refund:pi_1") == (EffectState.COMMITTED, 1)
    store.close()
