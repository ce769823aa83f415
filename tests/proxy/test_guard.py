"""The protected path through ``Guard.handle`` on a real SQLite ledger: coalescing of a
client's own retry, cancellation and failures at every step, and the thread hops per request.

Failures are injected through a stand-in forwarder (an injected collaborator, as httpx's
``MockTransport``); the coalescing of real traffic uses the real forwarder and a real loopback
Stripe.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ctrlrun import ledger
from ctrlrun.action import Principal
from ctrlrun.batch_job import Job
from ctrlrun.control import Control
from ctrlrun.errors import StoreError
from ctrlrun.proxy import guard as guard_module
from ctrlrun.proxy import settle
from ctrlrun.proxy.config import Upstream
from ctrlrun.proxy.config_parse import policy_from_yaml, proxy_config
from ctrlrun.proxy.forward import Forwarded, Forwarder
from ctrlrun.proxy.guard import Guard, Handled
from ctrlrun.proxy.routes import PassThrough, Request
from ctrlrun.receipts import load_receipts
from ctrlrun.store import SQLiteStateStore
from ctrlrun.testing import FakeStripe

T = TypeVar("T")
AGENT = Principal("agent-1")
KEY = "refund:pi_1"
BODY = b"payment_intent=pi_1&amount=1000"
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "{effect}"
    decision: allow
upstreams:
  stripe:
    profile: stripe
    url: {url}
    reconcile: {reconcile}
"""


class Gated:
    """Stands in for ``Forwarder``: each send waits for ``release``, then answers or raises."""

    def __init__(self, *replies: Forwarded | BaseException) -> None:
        self.replies = list(replies)
        self.calls: list[list[tuple[str, str]]] = []
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def send(
        self,
        upstream: Upstream,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
    ) -> Forwarded:
        self.calls.append(list(headers))
        self.entered.set()
        await self.release.wait()
        reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply


OK = Forwarded(200, (("Content-Type", "application/json"),), b'{"id": "re_1"}')
FIVE_HUNDRED = Forwarded(500, (("Content-Type", "application/json"),), b"{}")


def run(fn: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(fn(), 20)  # a hang fails, never stalls the suite

    return asyncio.run(bounded())


def make_control(
    tmp_path: Path,
    url: str = "http://127.0.0.1:9",
    reconcile: str = "off",
    effect: str = "refund:{payment_id}",
) -> Control:
    policy = policy_from_yaml(POLICY.format(url=url, reconcile=reconcile, effect=effect))
    return Control(policy, SQLiteStateStore(tmp_path / "state.db"))


@pytest.fixture
def control(tmp_path: Path) -> Iterator[Control]:
    ctl = make_control(tmp_path)
    yield ctl
    ctl.store.close()


@pytest.fixture
def eager(tmp_path: Path) -> Iterator[Control]:
    """A ledger whose Stripe upstream reconciles eagerly."""
    ctl = make_control(tmp_path, reconcile="eager")
    yield ctl
    ctl.store.close()


def upstream(ctl: Control) -> Upstream:
    return proxy_config(ctl.policy).upstreams[0]


def refund(
    guard: Guard, ctl: Control, *, body: bytes = BODY, idem: str | None = "idem-1"
) -> Awaitable[Handled | PassThrough]:
    headers = [
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Authorization", "Bearer sk_test_guard"),
    ]
    if idem:
        headers.append(("Idempotency-Key", idem))
    request = Request("POST", "/v1/refunds", headers={k.lower(): v for k, v in headers}, body=body)
    return guard.handle(
        upstream(ctl), request, target="/v1/refunds", headers=headers, principal=AGENT
    )


def state(ctl: Control, key: str = KEY) -> str | None:
    with ctl.store.reading() as conn:
        record = ledger.get_effect(conn, key)
    return None if record is None else record.state.value


def handled(result: object) -> Handled:
    assert isinstance(result, Handled), result
    return result


# -- cancellation ---------------------------------------------------------------------------


def test_a_cancelled_request_answers_its_waiting_retry_and_leaves_no_flight(
    control: Control,
) -> None:
    forwarder = Gated(OK)

    async def main() -> tuple[Handled, Handled]:
        guard = Guard(lambda: control, forwarder, {})  # type: ignore[arg-type]
        leader = asyncio.create_task(refund(guard, control))
        await forwarder.entered.wait()
        retry = asyncio.create_task(refund(guard, control))  # the client's own retry
        await asyncio.sleep(0.05)
        assert not retry.done()  # it waits for the leader instead of being refused

        leader.cancel()
        with pytest.raises(asyncio.CancelledError):  # not UnboundLocalError
            await leader
        waited = handled(await retry)
        assert guard.inflight.flights == {}
        assert guard.active == 0
        # The next same-key retry is not left hanging on a dead flight: the attempt is
        # ambiguous, so this one is the client's replay, forwarded (Stripe deduplicates).
        forwarder.release.set()
        return waited, handled(await refund(guard, control))

    waited, after = run(main)

    assert (waited.outcome, waited.reason) == ("upstream_ambiguous", "internal_error")
    assert waited.response.status == 504
    assert (after.outcome, after.reason) == ("committed", "idempotent_replay")
    assert len(forwarder.calls) == 2
    assert state(control) == "committed"  # the replay's answer settled the record


# -- failures at every step, with a retry waiting ------------------------------------------

STEPS = ["forward", "classify", "finish", "eager", "verdict"]


@pytest.mark.parametrize("step", STEPS)
def test_a_failure_at_any_step_still_answers_the_waiting_retry(
    eager: Control, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    ctl = eager
    reply: Forwarded | BaseException = FIVE_HUNDRED if step == "eager" else OK
    forwarder = Gated(RuntimeError("client bug") if step == "forward" else reply)

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise StoreError("ledger down") if step in ("finish", "eager") else KeyError("bug")

    if step == "classify":
        monkeypatch.setattr(guard_module, "classify", boom)
    elif step == "finish":
        monkeypatch.setattr(ctl, "finish", boom)
    elif step == "eager":
        monkeypatch.setattr(ctl, "eager_reconcile", boom)
    elif step == "verdict":
        monkeypatch.setattr(settle, "verdict", boom)

    async def main() -> tuple[Handled | BaseException, Handled, Guard]:
        guard = Guard(lambda: ctl, forwarder, {"stripe": lambda facts: "unknown"})  # type: ignore[arg-type, dict-item]
        leader = asyncio.create_task(refund(guard, ctl))
        await forwarder.entered.wait()
        retry = asyncio.create_task(refund(guard, ctl))
        await asyncio.sleep(0.05)
        forwarder.release.set()
        (first,) = await asyncio.gather(leader, return_exceptions=True)
        return first, handled(await retry), guard

    first, waited, guard = run(main)

    assert guard.inflight.flights == {}
    assert len(forwarder.calls) == 1  # the retry was never forwarded
    if isinstance(first, BaseException):
        # The leader's own error reaches the addon (which refuses); the retry is told the
        # attempt may have happened.
        assert step == "verdict"
        assert (waited.outcome, waited.reason) == ("upstream_ambiguous", "internal_error")
    else:
        assert waited is first
        expected = {
            "forward": ("upstream_ambiguous", "internal_error"),
            "classify": ("upstream_ambiguous", "internal_error"),
            "finish": ("upstream_ambiguous", "outcome_not_recorded"),
            "eager": ("upstream_ambiguous", "reconciler: unknown"),
        }[step]
        assert (first.outcome, first.reason) == expected
    if step in ("forward", "classify"):
        assert state(ctl) == "ambiguous"  # it may have left: nobody knows


# -- coalescing real traffic --------------------------------------------------------------


def test_a_retry_during_a_slow_attempt_gets_its_answer_and_the_remote_sees_one_write(
    tmp_path: Path,
) -> None:
    with FakeStripe() as fake:
        pi = fake.add_payment_intent(amount=5000)["id"]
        ctl = make_control(tmp_path, url=fake.url)
        body = f"payment_intent={pi}&amount=1000".encode()
        fake.delay_next(0.5)

        async def main() -> tuple[Handled, Handled, Handled]:
            forwarder = Forwarder(proxy_config(ctl.policy).upstreams)
            guard = Guard(lambda: ctl, forwarder, {})
            try:
                first = asyncio.create_task(refund(guard, ctl, body=body))
                await asyncio.sleep(0.2)
                same = asyncio.create_task(refund(guard, ctl, body=body))
                changed = asyncio.create_task(
                    refund(guard, ctl, body=body.replace(b"1000", b"2000"))
                )
                done = await asyncio.gather(first, same, changed)
                return handled(done[0]), handled(done[1]), handled(done[2])
            finally:
                await forwarder.aclose()

        try:
            first, same, changed = run(main)
            assert fake.count("POST", "/v1/refunds") == 1, (
                fake.requests,
                [(h.outcome, h.reason) for h in (first, same, changed)],
            )
        finally:
            ctl.store.close()

    assert first.outcome == "committed" and first.response.status == 200
    assert same is first  # the same answer, receipt and all
    # Another body under the same key is not the client's retry: the attempt holds the key.
    assert (changed.outcome, changed.response.status) == ("in_progress", 409)


# -- the hot path's thread hops -------------------------------------------------------------


@pytest.mark.parametrize("idem", [None, "idem-1"])
def test_a_committed_request_takes_two_decisions_on_the_loop_and_no_thread(
    control: Control, monkeypatch: pytest.MonkeyPatch, idem: str | None
) -> None:
    batches = control.store.batches()
    assert batches is not None  # SQLite: decisions share COMMITs
    control.store.write(lambda conn: None)  # a connection kept from before: none to open
    here: list[str] = []
    real = batches.run_here

    def counted(batch: list[Job]) -> bool:
        here.extend(getattr(job.fn, "__name__", None) or job.fn.func.__name__ for job in batch)
        return real(batch)

    def no_thread(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a decision left the loop's thread")

    monkeypatch.setattr(batches, "run_here", counted)
    monkeypatch.setattr(batches, "submit", no_thread)
    monkeypatch.setattr(guard_module.asyncio, "to_thread", no_thread)
    forwarder = Gated(OK)
    forwarder.release.set()

    async def main() -> Handled:
        guard = Guard(lambda: control, forwarder, {})  # type: ignore[arg-type]
        return handled(await refund(guard, control, idem=idem))

    assert run(main).outcome == "committed"
    assert here == ["admit", "finish"]  # begin (with the replay check), then finish


def test_the_attempts_own_idempotency_key_is_forwarded_when_the_client_sent_none(
    control: Control,
) -> None:
    forwarder = Gated(OK)
    forwarder.release.set()

    async def main() -> Handled:
        guard = Guard(lambda: control, forwarder, {})  # type: ignore[arg-type]
        return handled(await refund(guard, control, idem=None))

    run(main)
    keys = [v for k, v in forwarder.calls[0] if k.lower() == "idempotency-key"]
    assert len(keys) == 1 and keys[0] != ""
    with control.store.reading() as conn:
        row = ledger.get_effect_row(conn, KEY)
    assert row is not None and row["idempotency_key"] is None  # the client sent none
    assert hashlib.sha256(keys[0].encode()).hexdigest()  # a token, not a secret


def test_a_store_failure_before_forwarding_is_counted_and_refused(
    control: Control, monkeypatch: pytest.MonkeyPatch
) -> None:
    def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreError("ledger down")

    monkeypatch.setattr(control, "begin_once", down)
    forwarder = Gated(OK)

    async def main() -> tuple[Handled, Guard]:
        guard = Guard(lambda: control, forwarder, {})  # type: ignore[arg-type]
        return handled(await refund(guard, control, idem=None)), guard

    got, guard = run(main)
    assert (got.outcome, got.reason, got.response.status) == (
        "unavailable",
        "store_unavailable",
        503,
    )
    assert forwarder.calls == []
    assert guard.metrics.store_errors._value.get() == 1


# -- what the agent reads when the reply is lost ---------------------------------------------


def test_a_cut_reply_tells_the_agent_how_far_it_got_in_words(tmp_path: Path) -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        size = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(size)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n" + b"x" * 120)
        await writer.drain()
        writer.transport.abort()

    async def main() -> tuple[Handled, Control]:
        server = await asyncio.start_server(cut, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        ctl = make_control(tmp_path, url=f"http://127.0.0.1:{port}")
        forwarder = Forwarder(proxy_config(ctl.policy).upstreams)
        try:
            return handled(await refund(Guard(lambda: ctl, forwarder, {}), ctl)), ctl
        finally:
            await forwarder.aclose()
            server.close()

    got, ctl = run(main)
    try:
        assert (got.outcome, got.response.status) == ("upstream_ambiguous", 504)
        message = json.loads(got.response.body)["error"]["message"]
        assert "the connection closed after 120 of 500 body bytes" in message
        assert "IncompleteReadError" not in message
        with ctl.store.reading() as conn:
            record = ledger.get_effect(conn, KEY)
        # 2xx decides the record even though the body was cut; the agent is told it was lost.
        assert record is not None and record.state.value == "committed"
    finally:
        ctl.store.close()


def test_an_unresolvable_effect_key_is_refused_with_a_receipt(tmp_path: Path) -> None:
    ctl = make_control(tmp_path, effect="refund:{payment_id}:{order}")  # no order given
    forwarder = Gated(OK)

    async def main() -> Handled:
        guard = Guard(lambda: ctl, forwarder, {})  # type: ignore[arg-type]
        return handled(await refund(guard, ctl))

    try:
        got = run(main)
        assert (got.outcome, got.reason, got.response.status) == (
            "invalid_request",
            "effect_key_error",
            400,
        )
        assert forwarder.calls == []
        with ctl.store.reading() as conn:
            receipts = [r.document for r in load_receipts(conn)]
        assert [(r["receipt_id"], r["result"]) for r in receipts] == [(got.receipt_id, "denied")]
    finally:
        ctl.store.close()


def test_a_reconcile_first_asks_the_remote_outside_any_batch(tmp_path: Path) -> None:
    # An ambiguous key, then a new request for it: the kernel asks the reconciler before
    # deciding. The remote is asked on a worker thread, never on the loop and never while a
    # batch holds the ledger's lock (every decision queued behind it would wait).
    ctl = make_control(tmp_path, reconcile="lazy")
    batches = ctl.store.batches()
    assert batches is not None
    asked: list[tuple[bool, bool]] = []
    loop_thread: list[int] = []

    def hook(facts: Any) -> str:
        asked.append((threading.get_ident() == loop_thread[0], batches._lock.locked()))
        return "not_executed"

    forwarder = Gated(RuntimeError("cut"), OK)
    forwarder.release.set()

    async def main() -> tuple[Handled, Handled]:
        loop_thread.append(threading.get_ident())
        guard = Guard(lambda: ctl, forwarder, {"stripe": hook})  # type: ignore[arg-type, dict-item]
        lost = await refund(guard, ctl, idem="idem-1")
        again = await refund(guard, ctl, idem="idem-2")  # not a replay: another key
        return handled(lost), handled(again)

    try:
        lost, again = run(main)
        assert lost.outcome == "upstream_ambiguous"
        assert asked == [(False, False)]  # once, on a worker thread, the lock free
        assert again.outcome == "committed" and state(ctl) == "committed"
    finally:
        ctl.store.close()
