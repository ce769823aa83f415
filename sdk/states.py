"""The effect state machine: one enum, one transition table, one planning function.

Everything here is pure: the clock is passed in, and the stores only write what these
functions decide.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from .errors import InvalidArgument


class EffectState(StrEnum):
    """Where an effect key stands. ``NEW`` means "no record" and is never stored.

    ``RESERVED`` is the reference library's name for a key taken but not yet started. This
    ledger takes a key and starts its execution in one write, so it never stores ``RESERVED``;
    the name stays so that readers (``ctrlrun effects --state reserved``) keep their vocabulary.
    """

    NEW = "new"
    RESERVED = "reserved"
    EXECUTING = "executing"
    COMMITTED = "committed"
    FAILED = "failed"
    AMBIGUOUS = "ambiguous"


S = EffectState
LEASE_EXPIRED = "lease expired before an outcome was recorded"
# What a lease that ran out leaves. Its end on the monotonic clock goes too: an older writer's
# next lease on the key writes no holder columns, and must not inherit this one's.
LEASE_RAN_OUT = {"lease_expires_at": None, "lease_steady_until": None, "error": LEASE_EXPIRED}
STAMP_RESOLUTION = 0.001  # seconds: the ledger's stamps are in milliseconds

# Every write the ledger makes to an effect record, and nothing else: ``check_transition``
# refuses any other pair, and nothing ever deletes a record.
TRANSITIONS: frozenset[tuple[EffectState, EffectState]] = frozenset(
    {
        (S.NEW, S.EXECUTING),  # first attempt: one insert takes the key and starts it
        (S.FAILED, S.EXECUTING),  # renewal: attempt + 1
        (S.COMMITTED, S.EXECUTING),  # a new intent once the action's window has passed
        (S.EXECUTING, S.COMMITTED),  # the outcomes an attempt records
        (S.EXECUTING, S.FAILED),
        (S.EXECUTING, S.AMBIGUOUS),  # also: the holder's lease ran out
        (S.AMBIGUOUS, S.COMMITTED),  # a human or a reconcile answer
        (S.AMBIGUOUS, S.FAILED),
    }
)


def check_transition(old: EffectState, new: EffectState) -> None:
    """Raise ``InvalidArgument`` unless ``old -> new`` is in the table."""
    if (old, new) not in TRANSITIONS:
        raise InvalidArgument(f"effect transition {old.value} -> {new.value} is not allowed")


@dataclass(frozen=True)
class EffectRecord:
    """One row of the effect ledger."""

    effect_key: str
    state: EffectState
    action_id: str
    attempt: int
    lease_expires_at: datetime | None
    created_at: datetime
    updated_at: datetime
    committed_at: datetime | None = None
    action_name: str | None = None
    result: str | None = None
    error: str | None = None
    resolved_by: str | None = None
    idempotency_key: str | None = None
    holder: str | None = None  # the process that wrote the lease (holder.py)
    lease_steady_until: float | None = None  # its end on the holder host's monotonic clock
    committed_steady: float | None = None  # when committed, on the committer's monotonic clock
    committed_on: str | None = None  # that clock (``holder.clock``)

    def lease_is_live(self, now: datetime) -> bool:
        return (
            self.state in (S.RESERVED, S.EXECUTING)
            and self.lease_expires_at is not None
            and now <= self.lease_expires_at
        )


@dataclass(frozen=True)
class Reserve:
    """Take the key: a new record (``previous`` is ``NEW``) or a renewal of ``previous``."""

    attempt: int
    previous: EffectState


@dataclass(frozen=True)
class Refuse:
    """Refuse the attempt. ``kind`` is committed, in_progress or ambiguous."""

    kind: str
    holder: str
    ambiguate: bool = False  # the holder's lease expired: write the record AMBIGUOUS first


@dataclass(frozen=True)
class SteadyNow:
    """This host's monotonic clock as read with the facts, and its name (``clock``: boot id
    and time namespace, None where it cannot be told)."""

    clock: str | None
    reading: float


def window_over(
    record: EffectRecord, now: datetime, window: timedelta, steady: SteadyNow | None
) -> bool:
    """Whether a committed record's ``window`` has passed: on the ledger's clock (``now``)
    *and* in elapsed time, which no step of the wall clock shortens.

    The elapsed time is this host's monotonic clock since the commit when the commit was read
    on it (``committed_on``: same boot, same time namespace, whichever process). Any other
    commit (another boot, another host, an older writer's) is given this host's time since
    boot: on this host it happened before the boot, so a wall clock set wrong at boot (and
    stepped right later) cannot reopen it early; elsewhere it only adds a wait. ``steady``
    None: the ledger's clock alone (a planner given no reading)."""
    committed_at = record.committed_at or record.updated_at
    if now < committed_at + window:
        return False
    if steady is None:
        return True
    elapsed = steady.reading
    same = steady.clock is not None and record.committed_on == steady.clock
    if same and record.committed_steady is not None:
        # An older writer's commit over a newer one's leaves the older reading: the elapsed
        # time is then overstated, as on the ledger's clock alone, never understated.
        elapsed = steady.reading - record.committed_steady
    return elapsed + STAMP_RESOLUTION >= window.total_seconds()  # not a float's rounding


def plan_reservation(
    record: EffectRecord | None,
    now: datetime,
    window: timedelta | None = None,
    steady: SteadyNow | None = None,
) -> Reserve | Refuse:
    """What a new attempt on a key gets, given the key's record (the table in DESIGN.md)."""
    if record is None:
        return Reserve(attempt=1, previous=S.NEW)
    state = record.state
    if state is S.FAILED:
        return Reserve(attempt=record.attempt + 1, previous=S.FAILED)
    if state is S.COMMITTED:
        if window is not None and window_over(record, now, window, steady):
            return Reserve(attempt=record.attempt + 1, previous=S.COMMITTED)
        return Refuse("committed", record.action_id)
    if state is S.AMBIGUOUS:
        return Refuse("ambiguous", record.action_id)
    if record.lease_is_live(now):
        return Refuse("in_progress", record.action_id)
    return Refuse("ambiguous", record.action_id, ambiguate=True)
