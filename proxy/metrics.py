"""Prometheus metrics of one sidecar, on its own registry."""

from __future__ import annotations

from datetime import timedelta

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ctrlrun import checks, ledger
from ctrlrun.action import utc_now
from ctrlrun.states import EffectState
from ctrlrun.store import StateStore

STALE = timedelta(hours=1)  # ambiguous for longer than this: a human should look


class Metrics:
    """Counters the guard moves, and gauges read from the ledger at scrape time."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.decisions = Counter(
            "ctrlrun_decisions",
            "Protected requests by action and outcome",
            ["action", "outcome"],
            registry=self.registry,
        )
        self.reconciliations = Counter(
            "ctrlrun_reconciliations", "Reconciler answers", ["answer"], registry=self.registry
        )
        self.store_errors = Counter(
            "ctrlrun_store_errors", "Ledger errors that refused a request", registry=self.registry
        )
        self.upstream_latency = Histogram(
            "ctrlrun_upstream_latency_seconds",
            "Time to forward a protected request upstream",
            ["upstream"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.effects = Gauge(
            "ctrlrun_effects", "Effect records by state", ["state"], registry=self.registry
        )
        self.ambiguous_open = Gauge(
            "ctrlrun_ambiguous_effects_open",
            "Effects whose outcome is unknown",
            registry=self.registry,
        )
        self.ambiguous_stale = Gauge(
            "ctrlrun_ambiguous_effects_older_than_1h",
            "Effects ambiguous for more than an hour",
            registry=self.registry,
        )

    def render(self, store: StateStore) -> bytes:
        """The exposition text; effect gauges are read from the ledger now (blocking)."""
        try:
            with store.reading() as conn:
                counts = ledger.count_effects(conn)
        except Exception:
            self.store_errors.inc()
            counts = {}
        for state in EffectState:
            if state is not EffectState.NEW:
                self.effects.labels(state.value).set(counts.get(state.value, 0))
        self.ambiguous_open.set(counts.get(EffectState.AMBIGUOUS.value, 0))
        self._count_stale(store)
        return generate_latest(self.registry)

    def _count_stale(self, store: StateStore) -> None:
        # One range count on the (state, updated_at) index, not a read of every effect.
        try:
            with store.reading() as conn:
                stale = checks.count_ambiguous_before(conn, utc_now() - STALE)
        except Exception:  # a ledger that does not answer: the counts above already say so
            return
        self.ambiguous_stale.set(stale)
