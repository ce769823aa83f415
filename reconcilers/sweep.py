"""Settling ambiguous effects without waiting for an agent to retry.

``ctrlrun reconcile`` calls ``sweep`` once; the proxy calls it periodically.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from ctrlrun import checks, ledger
from ctrlrun.control import Control
from ctrlrun.reconcile import ReconcileOutcome, facts_for
from ctrlrun.states import EffectState

from .base import EffectFacts, ProxyReconciler

__all__ = ["facts_for", "sweep"]

log = logging.getLogger(__name__)


def sweep(
    control: Control,
    reconcilers: Mapping[str, ProxyReconciler | None],
    *,
    keys: list[str] | None = None,
    limit: int = 100,
    ask_now: bool = False,
) -> list[tuple[str, str]]:
    """Ask the upstreams' reconcilers about ambiguous effects; returns (key, answer) pairs.

    By default (the proxy, every interval) only effects that are due are asked about, never
    asked first and then soonest due, at most ``limit``; each ask is claimed on the ledger
    first, so two sidecars never ask about one effect in the same slot (``ctrlrun.checks``).
    ``keys`` or ``ask_now`` is a human asking: those effects, or every ambiguous one, now.
    Effects whose upstream has no reconciler here are left alone (and not reported).
    """
    expired = control.reconciler.expire_leases()
    for key in expired:
        log.info("lease of %s expired with no outcome: ambiguous", key)
    mine = {name for name, reconciler in reconcilers.items() if reconciler is not None}
    rows: list[Mapping[str, Any]]
    with control.store.reading() as conn:
        if keys:
            rows = [r for k in keys if (r := ledger.get_effect_row(conn, k)) is not None]
        elif ask_now:
            rows = checks.ambiguous(conn, mine, limit)
        else:
            rows = checks.due(conn, control.clock(), mine, limit)
    results: list[tuple[str, str]] = []
    for row in rows:
        answer = _check(control, reconcilers, row, named=bool(keys), now=bool(keys) or ask_now)
        if answer is not None:
            results.append((row["effect_key"], answer))
    return results


def _check(
    control: Control,
    reconcilers: Mapping[str, ProxyReconciler | None],
    row: Mapping[str, Any],
    *,
    named: bool,
    now: bool,
) -> str | None:
    if row["state"] != EffectState.AMBIGUOUS.value:
        return f"not ambiguous ({row['state']})"
    reconciler = reconcilers.get(row["upstream"] or "")
    if reconciler is None:
        return "no reconciler for this effect" if named else None
    hook = _ask(reconciler, facts_for(row, clock=control.clock))
    return control.reconciler.check(row, hook, trigger="sweep", force=now)


def _ask(reconciler: ProxyReconciler, facts: EffectFacts) -> Callable[[str], ReconcileOutcome]:
    return lambda _key: reconciler(facts)
