"""When this process stamped its attempts, on its monotonic clock as well as the ledger's.

A settle window ("nothing there proves the attempt did nothing once it can no longer be
applied") is judged on the ledger's clock, which on SQLite is this host's wall clock. A step
of that clock (NTP correcting a clock that was behind, a resumed VM) between an attempt's start
and a reconcile shortens the window by the step: "not found" then settles as not executed a
write the remote may still apply, and a retry does it again.

So each time this process writes an attempt's start or its AMBIGUOUS outcome, it notes the
stamp and ``time.monotonic()`` beside it. A reconciler in this process then also waits the
window out on the monotonic clock (``still_to_wait``). It can only add a wait: without a note
(another process wrote the stamp, or it was forgotten) the ledger's clock decides alone.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from .action import parse_iso

KEEP = 4096  # attempts remembered at most, the newest

_noted: OrderedDict[tuple[str, int], tuple[str, float]] = OrderedDict()
_lock = threading.Lock()
monotonic = time.monotonic  # this process's steady clock (a test moves it with the wall)


def note(effect_key: str, attempt: int, stamped: str) -> None:
    """``stamped`` (a ledger timestamp) was written for that attempt now."""
    with _lock:
        _noted[(effect_key, attempt)] = (stamped, monotonic())
        _noted.move_to_end((effect_key, attempt))
        while len(_noted) > KEEP:
            _noted.popitem(last=False)


def written(
    effect_key: str, attempt: int, values: Mapping[str, Any], ambiguous: bool = False
) -> bool:
    """A record written with ``values``: its attempt's start, or (``ambiguous``) its outcome,
    noted now. True, so that the ledger can answer with it."""
    stamped = values.get("updated_at" if ambiguous else "attempt_started_at")
    if isinstance(stamped, str):
        note(effect_key, int(values.get("attempt", attempt)), stamped)
    return True


def still_to_wait(effect_key: str, attempt: int, until: datetime) -> float:
    """Seconds before ``until`` (the ledger's clock) by this process's monotonic clock,
    counted from its last note of that attempt; 0.0 without one."""
    with _lock:
        seen = _noted.get((effect_key, attempt))
    if seen is None:
        return 0.0
    stamped = parse_iso(seen[0])
    if stamped.tzinfo is None:
        stamped = stamped.replace(tzinfo=UTC)
    if until.tzinfo is None:
        until = until.replace(tzinfo=UTC)
    window = (until - stamped).total_seconds()
    return max(0.0, seen[1] + window - monotonic())


def _after_fork() -> None:
    # The monotonic clock is the machine's, so the notes hold in a child; the lock may have
    # been held by a thread fork() did not copy.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)
