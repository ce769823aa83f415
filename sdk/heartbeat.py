"""Keeping an SDK call's lease longer than the call: renewed while its function runs.

A lease says how long a holder may be silent before a contender may presume it dead. A
function has no deadline ctrlrun can enforce (a thread cannot be stopped), so a slow one
outlived its lease: a retry found the lease expired, a reconciler found nothing yet, and the
effect ran twice. Here one thread per ``Control`` renews the lease of every running call
once a third of it has passed, to the ledger's now plus the whole lease. A call that ends
stops being renewed; a process that dies stops renewing, and its lease then runs out as
before. Calls shorter than a third of their lease cost a dictionary entry and nothing more.

    t=0 reserve (lease L)   t=L/3 renew -> now+L   t=2L/3 renew -> now+L   ... function returns

A lease is judged on the ledger's clock, which on SQLite is this host's wall clock: a step
forward (NTP, a resumed VM) of more than what is left of a lease made a running call's lease
look expired until its next renewal, and a retry in that gap ambiguated it, heard
``not_executed`` from a remote the running call had not reached yet, and ran the effect a
second time. So a contender in this process does not take the lease of a call this process
is running as expired, whatever the clock says (``running_here``).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import update

from . import holder
from .action import iso
from .schema import effects as E
from .states import EffectState as S

if TYPE_CHECKING:
    from .attempt import Attempt
    from .states import EffectRecord
    from .store import StateStore

log = logging.getLogger(__name__)
MAX_WAIT = 1.0  # seconds the thread sleeps at most: it notices a stop or a new call by then
# (action_id, attempt) of every call this process is running under a lease -> its pid (a
# child after fork() inherits the dict, not the calls)
_RUNNING: dict[tuple[str, int], int] = {}


def running_here(action_id: str, attempt: int) -> bool:
    """Whether this process is running that attempt's function now (its holder is alive)."""
    return _RUNNING.get((action_id, attempt)) == os.getpid()


def _after_fork_in_child() -> None:
    _RUNNING.clear()
    for heartbeat in list(_ALL):
        heartbeat._forked()


_ALL: weakref.WeakSet[Heartbeat] = weakref.WeakSet()
os.register_at_fork(after_in_child=_after_fork_in_child)


def as_seen_here(record: EffectRecord, now: datetime) -> EffectRecord:
    """``record``, its lease live at ``now`` if its holder is a call running in this process,
    or a process on this host that is alive and whose lease has not run out on this host's
    monotonic clock, or a lease this process saw live with time left that has not run out
    since on that clock (``holder.py``), whatever the wall clock says."""
    ends = record.lease_expires_at
    if ends is None or record.state not in (S.RESERVED, S.EXECUTING):
        return record
    seen = (record.effect_key, record.action_id, record.attempt, ends)
    if ends >= now:
        holder.saw_live(*seen, now)
        return record
    if (
        running_here(record.action_id, record.attempt)
        or holder.alive_elsewhere(record.holder, record.lease_steady_until)
        or holder.seen_live(*seen)
    ):
        return replace(record, lease_expires_at=now)
    return record


@dataclass
class _Held:
    key: str
    action_id: str
    attempt: int
    lease: timedelta
    due: float  # monotonic time of the next renewal


class _Holding:
    """``Heartbeat.holding`` for a held attempt (a class: it is entered on every call)."""

    __slots__ = ("attempt", "heartbeat", "ident", "lease")

    def __init__(self, heartbeat: Heartbeat, attempt: Attempt, lease: timedelta) -> None:
        self.heartbeat, self.attempt, self.lease = heartbeat, attempt, lease

    def __enter__(self) -> None:
        self.ident = self.heartbeat.hold(self.attempt, self.lease)
        _RUNNING[self.running] = os.getpid()

    def __exit__(self, *exc: object) -> None:
        _RUNNING.pop(self.running, None)  # renewed or not, the function has returned
        self.heartbeat.release(self.ident)

    @property
    def running(self) -> tuple[str, int]:
        assert self.attempt.held_key is not None
        return self.attempt.action.action_id, self.attempt.held_key[1]


class Heartbeat:
    """Renews the leases of the calls running under one ledger (see the module docstring)."""

    def __init__(
        self,
        store: StateStore,
        clock: Callable[[], datetime],
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.clock, self.monotonic = store, clock, monotonic
        self._ids = itertools.count()
        self._forked()
        _ALL.add(self)

    def _forked(self) -> None:
        """A fresh start: at creation, and in a child after ``fork()``, which has no renewing
        thread (only the one that forked is copied) and none of its parent's calls. A child
        that kept the parent's "started" thread never renewed its own calls' leases: a retry
        found them expired while they ran."""
        self._held: dict[int, _Held] = {}
        self._wake = threading.Condition()  # the parent's may have been held at the fork
        self._thread: threading.Thread | None = None
        self._waking_at = 0.0  # monotonic time the thread wakes by itself, while it waits

    def holding(self, attempt: Attempt, lease: timedelta) -> AbstractContextManager[None]:
        """Renew ``attempt``'s lease until the block ends (nothing for an unheld attempt)."""
        if attempt.held_key is None:
            return nullcontext()
        return _Holding(self, attempt, lease)

    def hold(self, attempt: Attempt, lease: timedelta) -> int:
        """Start renewing ``attempt``'s lease; returns the id to ``release`` it by."""
        assert attempt.held_key is not None
        key, number = attempt.held_key
        third = lease.total_seconds() / 3
        entry = _Held(key, attempt.action.action_id, number, lease, self.monotonic() + third)
        ident = next(self._ids)
        with self._wake:
            self._held[ident] = entry
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="ctrlrun-heartbeat", daemon=True
                )
                self._thread.start()
            elif entry.due < self._waking_at:
                self._wake.notify()  # due before the thread would look: wake it now
        return ident

    def release(self, ident: int) -> None:
        """Stop renewing the lease ``hold`` returned ``ident`` for."""
        with self._wake:
            self._held.pop(ident, None)

    def _run(self) -> None:
        while True:
            with self._wake:
                now = self.monotonic()
                due = [(i, h) for i, h in self._held.items() if h.due <= now]
                soonest = min((h.due for h in self._held.values()), default=now + MAX_WAIT)
                if not due:
                    timeout = min(MAX_WAIT, max(soonest - now, 0.01))
                    self._waking_at = now + timeout
                    self._wake.wait(timeout)
                    self._waking_at = 0.0
                    continue
            for ident, held in due:
                self._renew(ident, held)

    def _renew(self, ident: int, held: _Held) -> None:
        third = held.lease.total_seconds() / 3
        try:
            moved = self.extend(held)
        except Exception as exc:  # the ledger is away: try again soon, the lease still runs
            log.warning("cannot renew the lease of %s: %s", held.key, exc)
            held.due = self.monotonic() + min(third, MAX_WAIT)
            return
        if not moved:
            # The record is no longer this running attempt's: it ended meanwhile (fine), or its
            # lease ran out before a renewal was written and a contender ambiguated it.
            with self._wake:
                still_running = self._held.pop(ident, None) is not None
            if still_running:
                log.warning("%s: the lease ran out while its function was running", held.key)
            return
        held.due = self.monotonic() + third

    def extend(self, held: _Held) -> bool:
        """Move the lease of a running attempt to the ledger's now plus its whole lease."""
        until = iso(self.clock() + held.lease)
        stmt = (
            update(E)
            .where(
                E.c.effect_key == held.key,
                E.c.state == "executing",
                E.c.action_id == held.action_id,
                E.c.attempt == held.attempt,
            )
            .values(
                lease_expires_at=until,
                lease_holder=holder.me(),
                lease_steady_until=holder.steady_until(held.lease),
            )
        )
        with self.store.transaction() as conn:
            return int(conn.execute(stmt).rowcount) == 1
