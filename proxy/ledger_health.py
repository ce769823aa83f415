"""Whether the ledger answers: one log line when it goes away and one when it comes back.

During an outage every protected request is refused with the same ``unavailable`` answer; the
refusals are counted (``ctrlrun_store_errors``, ``ctrlrun_decisions``), not logged one by one:
an agent retrying into an outage would otherwise write a line (once, a traceback) per request.
The state lives in the event loop's thread (the guard moves it after each admission), so it
needs no lock.
"""

from __future__ import annotations

import logging

from prometheus_client import Gauge

log = logging.getLogger(__name__)


class LedgerHealth:
    """The ledger's availability as the protected path last saw it; logs each change once."""

    def __init__(self, gauge: Gauge) -> None:
        self.available = True
        self.gauge = gauge
        self.gauge.set(1)

    def failed(self, what: str, exc: BaseException) -> None:
        """A protected request was refused because the ledger could not be used."""
        if self.available:
            self.available = False
            self.gauge.set(0)
            log.error(
                "ledger unavailable (%s): %s; protected writes are refused until it answers",
                what,
                exc,
            )

    def answered(self) -> None:
        """The ledger served an admission: protected writes flow again."""
        if not self.available:
            self.available = True
            self.gauge.set(1)
            log.warning("ledger available again: protected writes resume")
