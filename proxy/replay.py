"""A Stripe client's same-key retry of an ambiguous attempt: forwarded, because Stripe
deduplicates by ``Idempotency-Key``, and its answer settles the record.

The retry is a replay only when it is the same request: the same key as the attempt was
forwarded with, the same canonical action, the record still ``ambiguous`` and younger than
Stripe's key retention, and a policy that still allows the action.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ctrlrun import ledger
from ctrlrun.action import Action, parse_iso
from ctrlrun.control import Control, Outcome
from ctrlrun.policy import Decision
from ctrlrun.states import EffectState

from .prepare import Prepared

REPLAY_WINDOW = timedelta(hours=23)  # Stripe keeps idempotency keys for at least 24 hours
TRIGGER = "idempotent_replay"


@dataclass(frozen=True)
class Claimed:
    """This request replays an ambiguous attempt; its reconciliation has started."""

    effect_key: str


def replayable(
    row: Mapping[str, Any] | None, action: Action, idempotency_key: str, now: datetime
) -> bool:
    """Whether a request with ``idempotency_key`` repeats the ambiguous attempt ``row``."""
    if row is None or row["state"] != EffectState.AMBIGUOUS.value:
        return False
    if row["idempotency_key"] != idempotency_key:
        return False
    if now - parse_iso(row["updated_at"]) > REPLAY_WINDOW:
        return False
    # The old key on a changed request is not a transport retry: Stripe would refuse it
    # (idempotency_error), and that 400 says nothing about the first attempt.
    return bool(row["action_json"] == action.canonical.decode("utf-8"))


def claim(ctl: Control, prepared: Prepared) -> Claimed | None:
    """In a worker thread: a replay, with ``RECONCILIATION_STARTED`` written, or ``None``."""
    key, idem = prepared.effect_key, prepared.idempotency_key
    if key is None or not idem:
        return None
    if ctl.evaluate(prepared.action).decision is Decision.DENY:
        return None  # the policy now refuses the action: begin() records and says so
    with ctl.store.reading() as conn:
        row = ledger.get_effect_row(conn, key)
    if not replayable(row, prepared.action, idem, ctl.clock()):
        return None
    ctl.reconciler.started(key, TRIGGER)
    return Claimed(key)


def answer(outcome: Outcome) -> str:
    """What the replay's own outcome says about the first attempt."""
    return {"committed": "committed", "failed": "not_executed"}.get(outcome, "unknown")
