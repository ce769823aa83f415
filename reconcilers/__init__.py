"""Built-in reconcilers: ask the remote what really happened to an ambiguous effect.

For the SDK, factories return ``reconcile=`` hooks (``AttemptHook``) that the kernel asks with
the attempt's facts (``stripe_refunds``, ``stripe_payment_intent_cancels``, ``kubernetes_scale``,
``kubernetes_deletes``). For the proxy, one reconciler object per upstream receives the
effect's :class:`EffectFacts` (``StripeReconciler``, ``KubernetesReconciler``,
``DeclarativeReconciler``), built from a small frozen target (``StripeTarget``, ...) that the
proxy derives from its upstreams. Reconcilers only read; what they cannot prove is ``unknown``.
"""

from __future__ import annotations

from .base import EffectFacts, ProxyReconciler
from .declarative import Check, DeclarativeReconciler, DeclarativeTarget
from .factories import (
    AttemptHook,
    kubernetes_deletes,
    kubernetes_scale,
    parse_effect_key,
    stripe_payment_intent_cancels,
    stripe_refunds,
)
from .kubernetes import KubernetesReconciler, KubernetesTarget
from .stripe import StripeReconciler, StripeTarget

__all__ = [
    "AttemptHook",
    "Check",
    "DeclarativeReconciler",
    "DeclarativeTarget",
    "EffectFacts",
    "KubernetesReconciler",
    "KubernetesTarget",
    "ProxyReconciler",
    "StripeReconciler",
    "StripeTarget",
    "kubernetes_deletes",
    "kubernetes_scale",
    "parse_effect_key",
    "stripe_payment_intent_cancels",
    "stripe_refunds",
]
