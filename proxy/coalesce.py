"""Same-key coalescing: a client's own transport retry waits for the attempt it repeats.

A Stripe client that times out re-sends the same request with the same ``Idempotency-Key``.
While the first attempt still executes, the retry must neither be refused as ``in_progress``
(the client would give up on an effect that may succeed) nor forwarded (a second effect):
it waits for the first attempt's answer and gets that answer::

    attempt 1   lead(key) ---- forward ---- settle ---- resolve(answer) -> ends the flight
    retry                 join(key) ............................ answer

The flight's future is resolved whatever happens to the leader (an answer, an exception, a
cancellation), so no retry waits forever and no flight outlives its leader.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class Flight(Generic[T]):
    """One executing attempt that same-key retries may wait for."""

    idempotency_key: str | None
    digest: str  # of the request body: a changed request is not a retry
    done: asyncio.Future[T] = field(repr=False)

    def resolve(self, value: T) -> None:
        if not self.done.done():
            self.done.set_result(value)


class Coalescer(Generic[T]):
    """The flights in progress, by effect key."""

    def __init__(self) -> None:
        self.flights: dict[str, Flight[T]] = {}

    def join(
        self, key: str | None, idempotency_key: str | None, digest: str
    ) -> asyncio.Future[T] | None:
        """The answer to wait for, when this request repeats an attempt still executing."""
        if key is None or not idempotency_key:
            return None
        flight = self.flights.get(key)
        if flight is None or flight.idempotency_key != idempotency_key or flight.digest != digest:
            return None
        return flight.done

    def lead(
        self,
        key: str | None,
        idempotency_key: str | None,
        digest: str,
        fallback: Callable[[BaseException], T],
    ) -> _Leading[T]:
        """Register the attempt that holds ``key``: ``with coalescer.lead(...) as flight``.

        ``fallback(exc)`` is what waiting retries get when the leader ends without resolving
        its flight (it raised, or was cancelled).
        """
        loop = asyncio.get_running_loop()
        flight = Flight(idempotency_key, digest, loop.create_future())
        return _Leading(self, key, flight, fallback)


class _Leading(Generic[T]):
    """The context of a leading attempt: its flight is resolved and removed on exit."""

    def __init__(
        self,
        owner: Coalescer[T],
        key: str | None,
        flight: Flight[T],
        fallback: Callable[[BaseException], T],
    ) -> None:
        self.owner, self.key, self.flight, self.fallback = owner, key, flight, fallback

    def __enter__(self) -> Flight[T]:
        if self.key is not None:
            self.owner.flights[self.key] = self.flight
        return self.flight

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if not self.flight.done.done():
                error = exc or RuntimeError("the attempt ended without an answer")
                try:
                    self.flight.resolve(self.fallback(error))
                except Exception as failed:  # the fallback itself failed: waiters see that
                    self.flight.done.set_exception(failed)
                    self.flight.done.exception()  # retrieved: no "never retrieved" warning
        finally:
            if self.key is not None and self.owner.flights.get(self.key) is self.flight:
                del self.owner.flights[self.key]
