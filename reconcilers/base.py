"""The interface every built-in reconciler implements, for the SDK and for the proxy.

A reconciler asks the remote what happened to one effect and answers ``committed``,
``not_executed`` or ``unknown``. It only reads; every transport or HTTP error is ``unknown``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from ctrlrun.reconcile import ReconcileOutcome


@dataclass(frozen=True)
class EffectFacts:
    """What the proxy knows about one attempt when it asks a reconciler."""

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


class ProxyReconciler(Protocol):
    """Answers for one upstream; blocking, bounded by its own timeouts."""

    def __call__(self, facts: EffectFacts) -> ReconcileOutcome: ...
