"""Ledger decisions for an event loop: never blocking it, many of them to one COMMIT.

``await decide(store, fn, *args)`` runs ``fn(*args)`` and hands back its result (or its
exception) once what it wrote is committed.

- On a store that batches (SQLite: ``store.batches()``, a ``GroupCommit``), the calls the loop
  queued during one of its iterations run as one batch at the end of it, in one transaction:
  on the loop's own thread when nothing can make it wait (``GroupCommit.run_here``), else on
  the store's decision thread (``GroupCommit.submit``).
- On any other store (PostgreSQL, whose statements are round trips) each call takes a worker
  thread of its own (``asyncio.to_thread``), in a transaction of its own. (A pool of decision
  threads handing results back in bulk measured no faster: 0.29-0.37x mitmdump's writes
  against 0.31-0.37x.)

``fn`` must not wait on the network (a reconcile, a webhook): every decision of its batch
would wait too. Such calls keep to ``asyncio.to_thread``.

Results from the decision thread come back to the loop in bulk: the first one ready
schedules a single callback, which hands over every result that arrived until it runs.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from .batch_job import Job
from .group_commit import MAX_GROUP, GroupCommit

if TYPE_CHECKING:
    from .store import StateStore

T = TypeVar("T")


async def decide(store: StateStore, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on the ledger's decision thread, or a worker thread; its
    result, once it is committed (or its exception)."""
    batches = store.batches()
    if batches is None:
        return await asyncio.to_thread(fn, *args, **kwargs)
    if kwargs:
        fn = functools.partial(fn, **kwargs)
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    wake = _waker(loop)
    wake.queue(batches, Job(fn, args, lambda result, error: wake.add(future, result, error)))
    return await future


class _Waker:
    """One loop's decisions: queued during an iteration of the loop, run together at its end
    (``GroupCommit.run_here``, else the decision thread), and their results handed back, a
    callback per burst rather than per result."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # not kept alive by its entry in ``_wakers``
        self.owner = threading.get_ident()  # the loop's thread
        self._ready: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        self._lock = threading.Lock()
        self._scheduled = False
        self._jobs: list[tuple[GroupCommit, Job]] = []

    def queue(self, batches: GroupCommit, job: Job) -> None:
        self._jobs.append((batches, job))
        if len(self._jobs) == 1:
            asyncio.get_running_loop().call_soon(self._decide)

    def _decide(self) -> None:
        jobs, self._jobs = self._jobs, []
        by_store: dict[GroupCommit, list[Job]] = {}
        for batches, job in jobs:
            by_store.setdefault(batches, []).append(job)
        for batches, queued in by_store.items():
            for start in range(0, len(queued), MAX_GROUP):
                batch = queued[start : start + MAX_GROUP]
                try:
                    ran = batches.run_here(batch)
                except Exception:  # the connection broke: the decision thread opens another
                    ran = False
                if not ran:
                    for job in batch:
                        self._submit(batches, job)

    def _submit(self, batches: GroupCommit, job: Job) -> None:
        try:
            batches.submit(job)
        except BaseException as exc:  # closed: refused, never left waiting
            job.done(None, exc)

    def add(self, future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        if threading.get_ident() == self.owner:  # decided on the loop: answered directly
            _answer(future, result, error)
            return
        with self._lock:
            self._ready.append((future, result, error))
            if self._scheduled:
                return
            self._scheduled = True
        loop = self._loop()
        try:
            if loop is None:
                raise RuntimeError("the loop is gone")
            loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            with self._lock:
                self._ready.clear()
                self._scheduled = False

    def _flush(self) -> None:
        with self._lock:
            ready, self._ready, self._scheduled = self._ready, [], False
        for future, result, error in ready:
            _answer(future, result, error)


def _answer(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # its caller was cancelled; the decision stands, recorded
        return
    if error is None:
        future.set_result(result)
    elif isinstance(error, StopIteration):  # a future cannot hold one
        future.set_exception(RuntimeError(f"decision raised {error!r}"))
    else:
        future.set_exception(error)


_wakers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Waker] = weakref.WeakKeyDictionary()
_wakers_lock = threading.Lock()


def _waker(loop: asyncio.AbstractEventLoop) -> _Waker:
    waker = _wakers.get(loop)
    if waker is None:
        with _wakers_lock:
            waker = _wakers.setdefault(loop, _Waker(loop))
    return waker
