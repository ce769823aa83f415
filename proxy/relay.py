"""Protected writes that open a stream (``k8s.exec``, ``attach``, ``port_forward``): decided and
admitted like any write, then relayed by mitmproxy itself, which alone can carry a WebSocket
or an upgraded TCP stream both ways. The record is settled by the remote's answer::

    request hook   policy, then begin: the attempt is executing      (a refusal reaches nothing)
    response hook  101 (or 2xx): committed, the command runs; 4xx: failed; else ambiguous
    error hook     no connection made: failed; else (reset, client gone): ambiguous

If the ledger cannot record the answer, the upgrade is replaced by ctrlrun's answer, so the
remote's end of the stream is closed and the agent is told.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ctrlrun.attempt import Attempt
from ctrlrun.control import Control, Outcome
from ctrlrun.decisions import decide

from .classify import Transport, classify
from .config import Upstream
from .forward import Forwarded
from .kube_stream import STREAM_ACTIONS
from .prepare import Prepared
from .refusals import Refusal
from .settle import not_recorded

log = logging.getLogger(__name__)


@dataclass
class Relayed:
    """An admitted stream write that mitmproxy forwards; settled once by ``settle``."""

    control: Control
    upstream: Upstream
    prepared: Prepared
    attempt: Attempt
    settled: bool = field(default=False)

    @property
    def action(self) -> str:
        return self.prepared.action.name


def is_relayed(prepared: Prepared) -> bool:
    """Whether this action is forwarded by mitmproxy's own relay, not by the h1 forwarder."""
    return prepared.action.name in STREAM_ACTIONS


def outcome_of(relay: Relayed, status: int | None, transport: Transport | None) -> Outcome:
    if status == 101:
        return "committed"  # the remote switched protocols: the command or tunnel is running
    return classify(relay.upstream.profile, relay.action, status=status, transport=transport)


async def settle(
    relay: Relayed, status: int | None, transport: Transport | None, error: str | None
) -> tuple[Outcome, str | None] | Refusal:
    """Record the attempt's outcome once: the outcome and receipt id, or a refusal to answer."""
    if relay.settled:
        raise RuntimeError("a relayed attempt is settled once")
    relay.settled = True
    outcome = outcome_of(relay, status, transport)
    if error is None and outcome != "committed":
        error = f"HTTP {status}"
    try:
        receipt = await decide(
            relay.control.store, relay.control.finish, relay.attempt, outcome, error=error
        )
    except Exception as exc:
        log.error("%s: outcome %s not recorded: %s", relay.action, outcome, type(exc).__name__)
        return not_recorded(relay.prepared, Forwarded(status, error=error), exc)
    log.info("%s relayed: %s (%s)", relay.action, outcome, status or error)
    return outcome, receipt.receipt_id
