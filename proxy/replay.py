"""A Stripe client's same-key retry of an ambiguous attempt: forwarded, because Stripe
deduplicates by ``Idempotency-Key``; its answer settles the record only when it is evidence.

The retry is a replay only when it is the same request: the same key as the attempt was
forwarded with, the same canonical action, the record still ``ambiguous`` and younger than
Stripe's key retention, and a policy that still allows the action.

What the retry's answer proves about the first attempt (``evidence``)::

    2xx                                           committed: the effect exists now, once
                                                  (replayed, or run now because nothing
                                                  was stored: the first never ran)
    Idempotent-Replayed: true, a refusal (4xx)    not_executed: Stripe's stored answer
                                                  to the first attempt was a refusal
    anything else: 401, 403, 409 (key in use),    unknown: Stripe answers these before
    429, 400 (idempotency_error included), a      its idempotency layer (or cannot say),
    replayed or fresh 5xx, no status              so they say nothing of the first
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ctrlrun import ledger
from ctrlrun.action import Action, parse_iso
from ctrlrun.control import Control, Outcome
from ctrlrun.policy import Decision
from ctrlrun.states import EffectState

from .classify import classify
from .forward import Forwarded
from .prepare import Prepared
from .refusals import Refusal

REPLAY_WINDOW = timedelta(hours=23)  # Stripe keeps idempotency keys for at least 24 hours
TRIGGER = "idempotent_replay"


@dataclass(frozen=True)
class Claimed:
    """This request replays an ambiguous attempt; its reconciliation has started."""

    effect_key: str
    about: tuple[str, int] | None  # the attempt replayed: its answer is evidence about it only


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
    """A decision (``decisions.decide``): a replay, with ``RECONCILIATION_STARTED``
    written, or ``None``."""
    key, idem = prepared.effect_key, prepared.idempotency_key
    if key is None or not idem:
        return None
    if ctl.evaluate(prepared.action).decision is Decision.DENY:
        return None  # the policy now refuses the action: begin() records and says so
    # Read in a write transaction: in a batch of decisions it joins the batch, and
    # sees what the decisions before it in the batch wrote.
    row = ctl.store.write(lambda conn: ledger.get_effect_row(conn, key))
    if not replayable(row, prepared.action, idem, ctl.clock()):
        return None
    return Claimed(key, ctl.reconciler.started(key, TRIGGER))


def evidence(reply: Forwarded) -> str:
    """What the retry's answer proves about the first attempt (see the module docstring)."""
    if reply.status is not None and 200 <= reply.status <= 299:
        return "committed"
    if not replayed(reply):
        return "unknown"
    outcome: Outcome = classify("stripe", "", status=reply.status, transport=reply.transport)
    return {"committed": "committed", "failed": "not_executed"}.get(outcome, "unknown")


def replayed(reply: Forwarded) -> bool:
    """Whether Stripe answered with the stored answer of the key's first request."""
    return any(
        name.lower() == "idempotent-replayed" and value.strip().lower() == "true"
        for name, value in reply.headers
    )


def inconclusive(prepared: Prepared, reply: Forwarded, key: str) -> Refusal:
    """The answer to a retry whose reply proves nothing: the record stays ambiguous."""
    got = f"HTTP {reply.status}" if reply.status is not None else (reply.error or "no answer")
    kind = _stripe_error(reply.body)
    return Refusal(
        "ambiguous",
        "replay_inconclusive",
        f"Stripe answered this same-key retry {got}{kind} without replaying the first "
        "attempt's answer, which says nothing about that attempt, so it stays ambiguous "
        "(re-send it with the same Idempotency-Key once the cause is fixed)",
        action=prepared.action.name,
        effect_key=key,
    )


def _stripe_error(body: bytes) -> str:
    """`` (type/code)`` of a Stripe error body; never its message, which may quote a key."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError, RecursionError):
        return ""
    if not isinstance(error, dict):
        return ""
    parts = [str(error[k])[:60] for k in ("type", "code") if isinstance(error.get(k), str)]
    return f" ({'/'.join(parts)})" if parts else ""
