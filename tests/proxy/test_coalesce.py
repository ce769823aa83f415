"""Same-key coalescing: a waiting retry gets the leader's answer, whatever becomes of the leader.

The guard-level twins (a cancelled request through ``Guard.handle``) are in ``test_guard.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from ctrlrun.proxy.coalesce import Coalescer

T = TypeVar("T")
KEY, IDEM, DIGEST = "refund:pi_1", "idem-1", "d1"


def run(fn: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(fn(), 5)  # a hang fails, never stalls the suite

    return asyncio.run(bounded())


def fallback(exc: BaseException) -> str:
    return f"fallback: {type(exc).__name__}"


@pytest.mark.parametrize(
    ("key", "idem", "digest"),
    [
        (None, IDEM, DIGEST),
        (KEY, None, DIGEST),
        (KEY, "", DIGEST),
        (KEY, "other", DIGEST),
        (KEY, IDEM, "changed body"),
        ("another:key", IDEM, DIGEST),
    ],
)
def test_only_the_same_request_joins(key: str | None, idem: str | None, digest: str) -> None:
    async def main() -> None:
        coalescer: Coalescer[str] = Coalescer()
        with coalescer.lead(KEY, IDEM, DIGEST, fallback) as flight:
            assert coalescer.join(KEY, IDEM, DIGEST) is flight.done
            assert coalescer.join(key, idem, digest) is None
            flight.resolve("ok")

    run(main)


def test_a_waiting_retry_gets_the_first_attempts_answer() -> None:
    async def main() -> tuple[str, str]:
        coalescer: Coalescer[str] = Coalescer()
        release = asyncio.Event()

        async def leader() -> str:
            with coalescer.lead(KEY, IDEM, DIGEST, fallback) as flight:
                await release.wait()
                flight.resolve("the remote's answer")
            return "the remote's answer"

        task = asyncio.create_task(leader())
        await asyncio.sleep(0)
        waiting = coalescer.join(KEY, IDEM, DIGEST)
        assert waiting is not None
        release.set()
        first = await task
        assert coalescer.flights == {}
        return first, await asyncio.shield(waiting)

    assert run(main) == ("the remote's answer", "the remote's answer")


@pytest.mark.parametrize("how", ["raises", "cancelled", "returns_without_an_answer"])
def test_the_flight_is_resolved_and_removed_whatever_the_leader_does(how: str) -> None:
    async def main() -> str:
        coalescer: Coalescer[str] = Coalescer()
        go = asyncio.Event()

        async def leader() -> None:
            with coalescer.lead(KEY, IDEM, DIGEST, fallback):
                await go.wait()
                if how == "raises":
                    raise KeyError("bug")

        task = asyncio.create_task(leader())
        await asyncio.sleep(0)
        waiting = coalescer.join(KEY, IDEM, DIGEST)
        assert waiting is not None
        if how == "cancelled":
            task.cancel()
        go.set()
        await asyncio.gather(task, return_exceptions=True)
        assert coalescer.flights == {}  # no entry left to make the next retry hang
        # The next same-key attempt leads a fresh flight and is answered.
        with coalescer.lead(KEY, IDEM, DIGEST, fallback) as again:
            again.resolve("second")
        assert await again.done == "second"
        return await waiting

    expected = {
        "raises": "fallback: KeyError",
        "cancelled": "fallback: CancelledError",
        "returns_without_an_answer": "fallback: RuntimeError",
    }[how]
    assert run(main) == expected


def test_a_failing_fallback_still_resolves_the_flight() -> None:
    def broken(exc: BaseException) -> str:
        raise ValueError("cannot build the answer")

    async def main() -> None:
        coalescer: Coalescer[str] = Coalescer()
        with pytest.raises(KeyError), coalescer.lead(KEY, IDEM, DIGEST, broken) as flight:
            raise KeyError("bug")
        assert flight.done.done() and coalescer.flights == {}
        with pytest.raises(ValueError, match="cannot build"):
            await flight.done

    run(main)


def test_an_older_leader_never_removes_a_newer_flight() -> None:
    async def main() -> None:
        coalescer: Coalescer[str] = Coalescer()
        old = coalescer.lead(KEY, "idem-old", DIGEST, fallback)
        first = old.__enter__()
        # The first attempt recorded its outcome; a renewal now holds the key.
        with coalescer.lead(KEY, "idem-new", DIGEST, fallback) as second:
            first.resolve("first")
            old.__exit__(None, None, None)
            assert coalescer.flights[KEY] is second
            second.resolve("second")
        assert coalescer.flights == {}

    run(main)


def test_a_request_without_an_effect_key_is_never_registered() -> None:
    async def main() -> None:
        coalescer: Coalescer[str] = Coalescer()
        with coalescer.lead(None, IDEM, DIGEST, fallback) as flight:
            assert coalescer.flights == {}
            flight.resolve("ok")
        assert await flight.done == "ok"

    run(main)
