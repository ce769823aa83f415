"""Which reconciler answers for which upstream: each upstream's configuration, turned into the
small target its profile's reconciler takes."""

from __future__ import annotations

from collections.abc import Sequence

from ctrlrun.reconcilers.base import ProxyReconciler
from ctrlrun.reconcilers.declarative import Check, DeclarativeReconciler, DeclarativeTarget
from ctrlrun.reconcilers.kubernetes import KubernetesReconciler, KubernetesTarget
from ctrlrun.reconcilers.stripe import StripeReconciler, StripeTarget

from .config import Upstream


def build(upstreams: Sequence[Upstream]) -> dict[str, ProxyReconciler | None]:
    """One reconciler per upstream (None where the profile has none, or reconcile is off)."""
    return {up.name: None if up.reconcile == "off" else reconciler_for(up) for up in upstreams}


def reconciler_for(up: Upstream) -> ProxyReconciler | None:
    if up.profile == "stripe":
        return StripeReconciler.for_target(stripe_target(up))
    if up.profile == "kubernetes":
        return KubernetesReconciler.for_target(kubernetes_target(up))
    if up.profile == "stripe-mcp":
        # Tool calls to Stripe's MCP server are settled by asking Stripe's REST API.
        return StripeReconciler.for_target(stripe_target(up))
    if up.profile == "mcp":
        return None
    target = declarative_target(up)
    return DeclarativeReconciler.for_target(target) if target.checks else None


def stripe_target(up: Upstream) -> StripeTarget:
    base = up.mcp.api_url if up.mcp is not None and up.mcp.api_url else up.url
    return StripeTarget(base, api_key_env=up.api_key_env, ca_file=up.ca_file, timeout=up.timeout)


def kubernetes_target(up: Upstream) -> KubernetesTarget:
    return KubernetesTarget(
        up.url, token_file=up.token_file, ca_file=up.ca_file, timeout=up.timeout
    )


def declarative_target(up: Upstream) -> DeclarativeTarget:
    checks = tuple(
        (route.action, Check(r.get, r.committed, r.not_executed))
        for route in up.routes
        if (r := route.reconcile) is not None
    )
    return DeclarativeTarget(up.url, checks, ca_file=up.ca_file, timeout=up.timeout)
