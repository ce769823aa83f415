"""Receipts for requests refused before the policy could decide them.

Every decision leaves a receipt, refusals included: an unmapped write, a write ctrlrun cannot
read, a write with no principal, egress to a host the policy does not list, a request whose
destination, Host and SNI disagree. The receipt's arguments are the method, the upstream (or
``-``), the host and the path without its query; its reason is a fixed code. Never a body,
never a header, never the query (it may carry anything).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from ctrlrun.action import Action, Principal
from ctrlrun.control import Control
from ctrlrun.decisions import decide

from .refusals import Refusal

log = logging.getLogger(__name__)

NOBODY = Principal("(none)")  # the principal of a request that named none


def code(refusal: Refusal) -> str:
    """The receipt's reason: fixed words, never the text of a request's own values."""
    return "invalid_request" if refusal.outcome == "invalid_request" else refusal.reason


def refusal_action(
    name: str,
    *,
    method: str,
    upstream: str | None,
    path: str,
    principal: Principal | None,
    environment: str,
    host: str | None = None,
) -> Action:
    """The action a refused request is recorded as (``name``: the route's, or a kind)."""
    arguments = {"method": method, "upstream": upstream or "-", "path": path.split("?", 1)[0]}
    if host is not None:
        arguments["host"] = host
    return Action(name, arguments, principal or NOBODY, None, environment)


async def write(
    ctl: Control, refusal: Refusal, action: Action, *, observed: bool = False
) -> Refusal:
    """Write the refusal's receipt; the refusal, with its receipt id, to answer with.

    A ledger that cannot take the receipt does not change the answer: the request is refused
    all the same, and the missing receipt is said loudly.
    """
    try:
        receipt = await decide(
            ctl.store,
            ctl.record_refusal,
            action,
            code(refusal),
            result="observed" if observed else "denied",
        )
    except Exception as exc:
        log.error("receipt of refused %s not written: %s", action.name, type(exc).__name__)
        return replace(refusal, action=refusal.action or action.name)
    return replace(refusal, action=refusal.action or action.name, receipt_id=receipt.receipt_id)
