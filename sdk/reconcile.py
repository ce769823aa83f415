"""Moving a record out of AMBIGUOUS: a reconcile hook's answer, or a human's resolution.

A record moves only the way the answer points: ``committed`` -> COMMITTED, ``not_executed``
-> FAILED, ``unknown`` (or a hook that raises or returns garbage) -> unchanged.

Every ask is counted on the record and pushes its next scheduled check back (``checks.py``).
An attempt's own asks (eager, blocking, a replay) record every answer; the sweep's asks record
an answer only when it differs from the last one recorded, so an effect whose remote keeps
answering ``unknown`` writes its events once, not once a sweep.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, cast

from . import budgets, ledger
from .action import iso, parse_iso
from .attempt import committed, describe
from .checks import BACKOFF, Backoff, answer_label, claim, remember, schedule_of
from .clocks import utc_now
from .errors import EffectKeyError, InvalidArgument
from .events import EventType
from .heartbeat import as_seen_here
from .redact import redact
from .states import EffectState

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from .store import StateStore

log = logging.getLogger(__name__)
ReconcileOutcome = Literal["committed", "not_executed", "unknown"]
ReconcileHook = Callable[[str], ReconcileOutcome]
ANSWERS = ("committed", "not_executed", "unknown")
_AMBIGUOUS = EffectState.AMBIGUOUS.value


class Evidenced(str):
    """A reconciler's answer with what it read to reach it, recorded on the answer's event."""

    evidence: str

    def __new__(cls, answer: ReconcileOutcome, evidence: str) -> Evidenced:
        made = super().__new__(cls, answer)
        made.evidence = evidence
        return made


def evidenced(answer: ReconcileOutcome, evidence: str) -> ReconcileOutcome:
    """``answer`` carrying ``evidence`` (still equal to the plain string)."""
    return cast(ReconcileOutcome, Evidenced(answer, evidence))


@dataclass(frozen=True)
class EffectFacts:
    """What the ledger knows about one attempt when a reconciler is asked about it.

    Times are on the ledger's clock (``ctrlrun.clocks``), and ``clock`` reads it, so "is the
    attempt old enough" is judged on the clock the attempt's start was written by.
    """

    effect_key: str
    action: str
    arguments: Mapping[str, Any]
    attempt_started_at: datetime
    idempotency_key: str | None = None  # the key the attempt was forwarded with (Stripe)
    # The credentials of the request that produced the effect, held in memory only.
    credentials: Mapping[str, str] = field(default_factory=dict, repr=False)
    # The attempt number; with the effect key it names the token the proxy injected as the
    # Idempotency-Key when the client sent none (``idempotency_token_for``).
    attempt: int = 1
    ended_at: datetime | None = None  # when the attempt was recorded ambiguous
    clock: Callable[[], datetime] = field(default=utc_now, compare=False, repr=False)


def facts_for(
    row: Mapping[str, Any],
    credentials: Mapping[str, str] | None = None,
    *,
    clock: Callable[[], datetime] = utc_now,
) -> EffectFacts:
    """The facts of the attempt an effect record holds, read back from the record."""
    action = json.loads(row["action_json"] or "{}")
    started = row["attempt_started_at"] or row["updated_at"]
    ambiguous = row["state"] == _AMBIGUOUS
    return EffectFacts(
        effect_key=row["effect_key"],
        action=row["action_name"] or action.get("name", ""),
        arguments=action.get("arguments", {}),
        attempt_started_at=parse_iso(started),
        idempotency_key=row["idempotency_key"],
        credentials=dict(credentials or {}),
        attempt=int(row["attempt"]),
        ended_at=parse_iso(row["updated_at"]) if ambiguous else None,
        clock=clock,
    )


def ask(hook: Callable[[str], Any], facts: Callable[[], EffectFacts | None], key: str) -> Any:
    """Ask a hook about ``key``: with the attempt's facts when it takes them (a
    ``reconcile_attempt(facts)`` method, as the built-in factories' hooks have), else the key."""
    with_facts = getattr(hook, "reconcile_attempt", None)
    if callable(with_facts):
        found = facts()
        return "unknown" if found is None else with_facts(found)
    return hook(key)


class NotAmbiguous(EffectKeyError):
    """``resolve`` was asked about a record that is not ambiguous (or does not exist)."""


def judge(raw: Any, error: BaseException | None = None) -> tuple[str, dict[str, Any]]:
    """A hook's return value (or exception) as an answer and the data its event records."""
    if error is not None:
        detail = describe(error)[:500]
        return "unknown", {"outcome": "unknown", "reason": "raised", "error": detail}
    if isinstance(raw, str) and raw in ANSWERS:
        answer = str(raw)
        evidence = getattr(raw, "evidence", None)
        if isinstance(evidence, str) and evidence:
            # A record moved carries what moved it (an ``unknown``, what it could not prove).
            return answer, {"outcome": answer, "evidence": redact(evidence)[:300]}
        return answer, {"outcome": answer}
    return "unknown", {
        "outcome": "unknown",
        "reason": "invalid_return",
        "error": redact(repr(raw))[:200],
    }


class Reconciler:
    """Asks hooks and records their answers on one ledger."""

    def __init__(
        self,
        store: StateStore,
        clock: Callable[[], datetime],
        *,
        backoff: Backoff = BACKOFF,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.store = store
        self.clock = clock
        self.backoff = backoff
        self.rand = rand

    def run(self, effect_key: str, hook: Callable[[str], Any], *, trigger: str) -> str:
        """Ask ``hook`` about ``effect_key`` once and apply its answer. Returns the answer."""
        about = self.started(effect_key, trigger)
        try:
            raw = ask(hook, lambda: self._facts(effect_key), effect_key)
        except Exception as exc:
            return self.settle(effect_key, None, error=exc, about=about)
        return self.settle(effect_key, raw, about=about)

    def _facts(self, effect_key: str) -> EffectFacts | None:
        with self.store.reading() as conn:
            row = ledger.get_effect_row(conn, effect_key)
        return None if row is None else facts_for(row, clock=self.clock)

    def started(self, effect_key: str, trigger: str) -> tuple[str, int] | None:
        """Write ``RECONCILIATION_STARTED``; returns the attempt asked about (action, number)."""
        with self.store.transaction() as conn:
            record = ledger.get_effect(conn, effect_key)
            ledger.append_event(
                conn,
                self.clock(),
                EventType.RECONCILIATION_STARTED,
                action_id=record.action_id if record else None,
                effect_key=effect_key,
                data={"effect_key": effect_key, "trigger": trigger},
            )
        return None if record is None else (record.action_id, record.attempt)

    def settle(
        self,
        effect_key: str,
        raw: Any,
        *,
        error: BaseException | None = None,
        about: tuple[str, int] | None = None,
    ) -> str:
        """Record a hook's answer (or its exception) and move the record if it points a way.

        ``about``: the attempt the hook was asked about. An answer is evidence about that
        attempt only; if another attempt holds the key by now (a renewal ran while the hook
        was asked), it is recorded and moves nothing."""
        answer, data = judge(raw, error)
        if answer != raw:
            log.warning("reconcile hook for %s: %s", effect_key, data.get("error"))
        now = self.clock()
        with self.store.transaction() as conn:
            row = ledger.get_effect_row(conn, effect_key)
            ledger.append_event(
                conn,
                now,
                EventType.RECONCILIATION_RESOLVED,
                action_id=row["action_id"] if row else None,
                effect_key=effect_key,
                data=data,
            )
            later = (
                about is not None
                and row is not None
                and ((row["action_id"], int(row["attempt"])) != about)
            )
            if later:
                log.info("reconciled %s: the answer is about an earlier attempt", effect_key)
            elif row is not None and row["state"] == _AMBIGUOUS:
                # An attempt's own ask counts too: the sweep waits its turn after it.
                claim(conn, row, self._next_check(row, now), force=True)
                self._apply(conn, row, answer, answer_label(data), now)
        log.info("reconciled %s: %s", effect_key, answer)
        return answer

    def check(
        self, row: Mapping[str, Any], hook: Callable[[str], Any], *, trigger: str, force: bool
    ) -> str | None:
        """A sweep's ask about one ambiguous record: claim its check, ask, record any change.

        None when another sidecar claimed this check first or the record moved. ``force`` (a
        human asking now) claims whatever the schedule says and records even a repeated answer.
        """
        key = row["effect_key"]
        claimed_at = self.clock()
        with self.store.transaction() as conn:
            if not claim(conn, row, self._next_check(row, claimed_at), force=force):
                log.debug("check of %s: claimed elsewhere, or the record moved", key)
                return None
        try:
            answer, data = judge(ask(hook, lambda: facts_for(row, clock=self.clock), key))
        except Exception as exc:
            answer, data = judge(None, exc)
        asked = schedule_of(row).checks + 1
        started = {"effect_key": key, "trigger": trigger, "check": asked}
        recorded = self._record_check(row, claimed_at, started, answer, data, always=force)
        if not recorded:  # the same as last time: one line a change, not one a sweep
            log.debug("checked %s: %s (unchanged, check %d)", key, answer, asked)
        elif data.get("error"):
            log.warning("reconcile hook for %s: %s", key, data["error"])
        else:
            log.info("checked %s: %s", key, answer)
        return answer

    def _record_check(
        self,
        row: Mapping[str, Any],
        claimed_at: datetime,
        started: dict[str, Any],
        answer: str,
        data: dict[str, Any],
        *,
        always: bool,
    ) -> bool:
        """Write a check's events unless it only repeats the last answer; True if written."""
        label = answer_label(data)
        now = self.clock()
        with self.store.transaction() as conn:
            current = ledger.get_effect_row(conn, row["effect_key"])
            same = current is not None and _same_attempt(current, row)
            if current is not None and same and not always and schedule_of(current).answer == label:
                return False
            events = [
                (claimed_at, EventType.RECONCILIATION_STARTED, started),
                (now, EventType.RECONCILIATION_RESOLVED, data),
            ]
            ledger.append_events(
                conn,
                [
                    ledger.event_row(ts, type_, row["action_id"], row["effect_key"], data=d)
                    for ts, type_, d in events
                ],
            )
            if same:  # else the answer is about an attempt that is no longer ambiguous
                self._apply(conn, row, answer, label, now)
        return True

    def _apply(
        self, conn: Connection, row: Mapping[str, Any], answer: str, label: str, now: datetime
    ) -> None:
        remember(conn, row, label)
        if answer == "unknown":
            return
        new = EffectState.COMMITTED if answer == "committed" else EffectState.FAILED
        if not self._move(conn, row, new, now, "reconcile", "reconcile"):
            # Another sidecar settled it between our read and our write: theirs stands.
            log.info("reconciled %s: already settled by someone else", row["effect_key"])

    def _next_check(self, row: Mapping[str, Any], now: datetime) -> datetime:
        return now + self.backoff.delay(schedule_of(row).checks + 1, self.rand())

    def resolve(
        self, effect_key: str, state: str, *, resolved_by: str, note: str | None = None
    ) -> None:
        """A human's answer: move an AMBIGUOUS record to ``committed`` or ``failed``; the
        operator's ``note`` (what they checked) is kept on the ``EFFECT_RESOLVED`` event."""
        if state not in ("committed", "failed"):
            raise InvalidArgument("resolve to 'committed' or 'failed'")
        now = self.clock()
        with self.store.transaction() as conn:
            row = ledger.get_effect_row(conn, effect_key)
            if row is None:
                raise NotAmbiguous(f"nobody reserved {effect_key!r}")
            if row["state"] != _AMBIGUOUS:
                raise NotAmbiguous(f"{effect_key!r} is not ambiguous (it is {row['state']})")
            if not self._move(conn, row, EffectState(state), now, resolved_by, "human", note):
                raise NotAmbiguous(f"{effect_key!r} was resolved by someone else first")

    def expire_leases(self, limit: int = 1000) -> list[str]:
        """Move records whose holder's lease ran out to AMBIGUOUS (a crash's leftovers).

        A new attempt does the same when it meets such a record; this lets a sweep find them
        without waiting for an agent to retry.
        """
        now = self.clock()
        moved: list[str] = []
        with self.store.transaction() as conn:
            for state in (EffectState.RESERVED, EffectState.EXECUTING):
                for rec in ledger.list_effects(conn, state, limit):
                    if as_seen_here(rec, now).lease_is_live(now):
                        continue
                    if ledger.expire_lease(conn, rec, now):
                        moved.append(rec.effect_key)
        return moved

    @staticmethod
    def _move(
        conn: Connection,
        row: Mapping[str, Any],
        new: EffectState,
        now: datetime,
        by: str,
        kind: str,
        note: str | None = None,
    ) -> bool:
        # The schedule's slot goes with the ambiguity; the count and last answer stay, for the
        # record (``check_attempt`` says which attempt they were about).
        values = {"updated_at": iso(now), "resolved_by": by, "next_check_at": None}
        if new is EffectState.COMMITTED:  # the window runs from here: no sooner than it was
            values.update(committed(now))
        if not ledger.move_effect(
            conn,
            row["effect_key"],
            old=EffectState.AMBIGUOUS,
            new=new,
            action_id=row["action_id"],
            attempt=row["attempt"],
            values=values,
        ):
            return False
        data: dict[str, Any] = {"state": new.value, "resolved_by": kind, "resolver": by}
        if note:
            data["note"] = note
        if new is EffectState.FAILED:  # it did not happen: its budget gets its amount back
            back = budgets.give_back(conn, row["effect_key"], row["action_id"], row["attempt"], now)
            if back is not None:
                data["budget_returned"] = back.amount
        ledger.append_event(
            conn,
            now,
            EventType.EFFECT_RESOLVED,
            action_id=row["action_id"],
            effect_key=row["effect_key"],
            data=data,
        )
        return True


def _same_attempt(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return a["state"] == _AMBIGUOUS and all(
        a[k] == b[k] for k in ("effect_key", "action_id", "attempt")
    )
