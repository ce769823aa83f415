"""The interface every built-in reconciler implements, for the SDK and for the proxy.

A reconciler asks the remote what happened to one effect and answers ``committed``,
``not_executed`` or ``unknown``. It only reads; every transport or HTTP error is ``unknown``.
"""

from __future__ import annotations

from typing import Protocol

from ctrlrun.reconcile import EffectFacts, ReconcileOutcome

__all__ = ["EffectFacts", "ProxyReconciler"]


class ProxyReconciler(Protocol):
    """Answers for one upstream; blocking, bounded by its own timeouts."""

    def __call__(self, facts: EffectFacts) -> ReconcileOutcome: ...
