"""Moving a record out of AMBIGUOUS: a reconcile hook's answer, or a human's resolution.

A record moves only the way the answer points: ``committed`` -> COMMITTED, ``not_executed``
-> FAILED, ``unknown`` (or a hook that raises or returns garbage) -> unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from . import ledger
from .action import iso
from .errors import EffectKeyError, InvalidArgument
from .events import EventType
from .states import EffectState

if TYPE_CHECKING:
    from .store import StateStore

log = logging.getLogger("ctrlrun")
ReconcileOutcome = Literal["committed", "not_executed", "unknown"]
ReconcileHook = Callable[[str], ReconcileOutcome]
ANSWERS = ("committed", "not_executed", "unknown")


class NotAmbiguous(EffectKeyError):
    """``resolve`` was asked about a record that is not ambiguous (or does not exist)."""


class Reconciler:
    """Asks hooks and records their answers on one ledger."""

    def __init__(self, store: StateStore, clock: Callable[[], datetime]) -> None:
        self.store = store
        self.clock = clock

    def run(self, effect_key: str, hook: Callable[[str], Any], *, trigger: str) -> str:
        """Ask ``hook`` about ``effect_key`` once and apply its answer. Returns the answer."""
        self.started(effect_key, trigger)
        try:
            raw = hook(effect_key)
        except Exception as exc:
            return self.settle(effect_key, None, error=exc)
        return self.settle(effect_key, raw)

    def started(self, effect_key: str, trigger: str) -> None:
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

    def settle(self, effect_key: str, raw: Any, *, error: BaseException | None = None) -> str:
        """Record a hook's answer (or its exception) and move the record if it points a way."""
        data: dict[str, Any]
        if error is not None:
            log.warning("reconcile hook for %s raised %s", effect_key, type(error).__name__)
            answer = "unknown"
            data = {
                "outcome": answer,
                "reason": "raised",
                "error": f"{type(error).__name__}: {' '.join(str(error).split())}"[:500],
            }
        elif isinstance(raw, str) and raw in ANSWERS:
            answer = raw
            data = {"outcome": answer}
        else:
            log.warning("reconcile hook for %s returned %r", effect_key, raw)
            answer = "unknown"
            data = {"outcome": answer, "reason": "invalid_return", "error": repr(raw)[:200]}
        now = self.clock()
        with self.store.transaction() as conn:
            record = ledger.get_effect(conn, effect_key)
            ledger.append_event(
                conn,
                now,
                EventType.RECONCILIATION_RESOLVED,
                action_id=record.action_id if record else None,
                effect_key=effect_key,
                data=data,
            )
            if answer != "unknown" and record is not None and record.state is EffectState.AMBIGUOUS:
                new = EffectState.COMMITTED if answer == "committed" else EffectState.FAILED
                if not self._move(conn, record, new, now, "reconcile", "reconcile"):
                    # Another sidecar settled it between our read and our write: theirs stands.
                    log.info("reconciled %s: already settled by someone else", effect_key)
        log.info("reconciled %s: %s", effect_key, answer)
        return answer

    def resolve(self, effect_key: str, state: str, *, resolved_by: str) -> None:
        """A human's answer: move an AMBIGUOUS record to ``committed`` or ``failed``."""
        if state not in ("committed", "failed"):
            raise InvalidArgument("resolve to 'committed' or 'failed'")
        now = self.clock()
        with self.store.transaction() as conn:
            record = ledger.get_effect(conn, effect_key)
            if record is None:
                raise NotAmbiguous(f"nobody reserved {effect_key!r}")
            if record.state is not EffectState.AMBIGUOUS:
                raise NotAmbiguous(f"{effect_key!r} is not ambiguous (it is {record.state.value})")
            if not self._move(conn, record, EffectState(state), now, resolved_by, "human"):
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
                    if not rec.lease_is_live(now) and ledger.expire_lease(conn, rec, now):
                        moved.append(rec.effect_key)
        return moved

    @staticmethod
    def _move(conn: Any, record: Any, new: EffectState, now: datetime, by: str, kind: str) -> bool:
        values = {"updated_at": iso(now), "resolved_by": by}
        if new is EffectState.COMMITTED:
            values["committed_at"] = iso(now)
        if not ledger.move_effect(
            conn,
            record.effect_key,
            old=EffectState.AMBIGUOUS,
            new=new,
            action_id=record.action_id,
            attempt=record.attempt,
            values=values,
        ):
            return False
        ledger.append_event(
            conn,
            now,
            EventType.EFFECT_RESOLVED,
            action_id=record.action_id,
            effect_key=record.effect_key,
            data={"state": new.value, "resolved_by": kind, "resolver": by},
        )
        return True
