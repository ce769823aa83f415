"""Settling ambiguous effects without waiting for an agent to retry.

``ctrlrun reconcile`` calls ``sweep`` once; the proxy calls it periodically.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from ctrlrun import ledger
from ctrlrun.action import parse_iso
from ctrlrun.control import Control
from ctrlrun.reconcile import ReconcileOutcome
from ctrlrun.states import EffectState

from .base import EffectFacts, ProxyReconciler

log = logging.getLogger("ctrlrun.reconcilers")


def facts_for(row: Mapping[str, Any], credentials: Mapping[str, str] | None = None) -> EffectFacts:
    """The facts a reconciler needs, read back from an effect record."""
    action = json.loads(row["action_json"] or "{}")
    started = row["attempt_started_at"] or row["updated_at"]
    return EffectFacts(
        effect_key=row["effect_key"],
        action=row["action_name"] or action.get("name", ""),
        arguments=action.get("arguments", {}),
        attempt_started_at=parse_iso(started),
        idempotency_key=row["idempotency_key"],
        credentials=dict(credentials or {}),
        attempt=int(row["attempt"]),
    )


def sweep(
    control: Control,
    reconcilers: Mapping[str, ProxyReconciler | None],
    *,
    keys: list[str] | None = None,
    limit: int = 100,
) -> list[tuple[str, str]]:
    """Ask the upstream's reconciler about each ambiguous effect; returns (key, answer) pairs.

    Effects whose upstream has no reconciler here are left alone (and not reported).
    """
    expired = control.reconciler.expire_leases()
    for key in expired:
        log.info("lease of %s expired with no outcome: ambiguous", key)
    with control.store.reading() as conn:
        if keys:
            rows = [r for k in keys if (r := ledger.get_effect_row(conn, k)) is not None]
        else:
            rows = [
                ledger.get_effect_row(conn, rec.effect_key) or {}
                for rec in ledger.list_effects(conn, EffectState.AMBIGUOUS, limit)
            ]
    results: list[tuple[str, str]] = []
    for row in rows:
        if not row or row["state"] != EffectState.AMBIGUOUS.value:
            if row:
                results.append((row["effect_key"], f"not ambiguous ({row['state']})"))
            continue
        reconciler = reconcilers.get(row["upstream"] or "")
        if reconciler is None:
            if keys:
                results.append((row["effect_key"], "no reconciler for this effect"))
            continue
        answer = control.reconciler.run(
            row["effect_key"], _ask(reconciler, facts_for(row)), trigger="sweep"
        )
        results.append((row["effect_key"], answer))
    return results


def _ask(reconciler: ProxyReconciler, facts: EffectFacts) -> Callable[[str], ReconcileOutcome]:
    return lambda _key: reconciler(facts)
