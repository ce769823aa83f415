"""Which reconciler answers for which upstream, by the upstream's profile."""

from __future__ import annotations

from collections.abc import Sequence

from ctrlrun.upstreams import Upstream

from .base import ProxyReconciler


def build(upstreams: Sequence[Upstream]) -> dict[str, ProxyReconciler | None]:
    """One reconciler per upstream (None where the profile has none, or reconcile is off)."""
    out: dict[str, ProxyReconciler | None] = {}
    for up in upstreams:
        out[up.name] = None if up.reconcile == "off" else _for(up)
    return out


def _for(up: Upstream) -> ProxyReconciler | None:
    if up.profile == "stripe":
        from .stripe import StripeReconciler

        return StripeReconciler.for_upstream(up)
    if up.profile == "kubernetes":
        from .kubernetes import KubernetesReconciler

        return KubernetesReconciler.for_upstream(up)
    if any(route.reconcile for route in up.routes):
        from .declarative import DeclarativeReconciler

        return DeclarativeReconciler.for_upstream(up)
    return None
