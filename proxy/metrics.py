"""Prometheus metrics of one sidecar, on its own registry.

The effect gauges count the ledger's records by state. The ledger is shared (other sidecars,
the SDK, ``ctrlrun resolve``, the sweep all move records), so only the ledger knows the
counts: counting this process's own transitions would drift. They are read (one ``GROUP BY``
and one index range count) at most every ``effects_ttl`` seconds, however many scrapers ask
and however often, and the values shown are at most that old.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ctrlrun import checks, ledger
from ctrlrun.states import EffectState
from ctrlrun.store import StateStore

EFFECTS_TTL = 15.0  # seconds: a common scrape interval, so one scraper costs one read per scrape
STALE = timedelta(hours=1)  # ambiguous for longer than this: a human should look


class Metrics:
    """Counters the guard moves, and gauges read from the ledger at scrape time (cached)."""

    def __init__(
        self,
        *,
        effects_ttl: float = EFFECTS_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
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
        self.notify_failures = Counter(
            "ctrlrun_notify_failures",
            "Webhook deliveries that failed (each is retried with backoff)",
            ["url"],
            registry=self.registry,
        )
        self.store_errors = Counter(
            "ctrlrun_store_errors", "Ledger errors that refused a request", registry=self.registry
        )
        self.ledger_available = Gauge(
            "ctrlrun_ledger_available",
            "1 while the ledger answers the protected path, 0 during an outage",
            registry=self.registry,
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
        self.clock_skew = Gauge(
            "ctrlrun_clock_skew_seconds",
            "This host's clock minus the ledger's, when last measured (0: the same clock)",
            registry=self.registry,
        )
        self.effects_ttl = effects_ttl
        self.clock = clock
        self._read_at: float | None = None
        self._lock = threading.Lock()  # scrapes run in worker threads: one reads, the rest wait

    def render(self, store: StateStore) -> bytes:
        """The exposition text (blocking: the effect gauges may be read from the ledger)."""
        self.refresh(store)
        return generate_latest(self.registry)

    def refresh(self, store: StateStore) -> None:
        """Read the effect counts, unless they were read less than ``effects_ttl`` ago."""
        with self._lock:
            now = self.clock()
            if self._read_at is not None and now - self._read_at < self.effects_ttl:
                return
            self._read_at = now  # a failed read is not retried before the TTL either
            try:
                skew = store.skew  # measured when the ledger's clock is read: no round trip
                self.clock_skew.set(0.0 if skew is None else skew.seconds)
                with store.reading() as conn:
                    counts = ledger.count_effects(conn)
                    # One range count on the (state, updated_at) index, not a read of every effect.
                    stale = checks.count_ambiguous_before(conn, store.clock() - STALE)
            except Exception:
                # The gauges keep their last values; the error counter says the read failed.
                self.store_errors.inc()
                return
            for state in EffectState:
                if state is not EffectState.NEW:
                    self.effects.labels(state.value).set(counts.get(state.value, 0))
            self.ambiguous_open.set(counts.get(EffectState.AMBIGUOUS.value, 0))
            self.ambiguous_stale.set(stale)
