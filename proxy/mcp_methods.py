"""A POST carrying a method its upstream's ``refuse_methods:`` names: refused, with a receipt.

MCP servers may act on more than tool calls (a ``resources/read`` that sends, a
``prompts/get`` that books). ctrlrun decides only ``tools/call``; an operator lists the other
methods of such a server under ``refuse_methods:`` and the sidecar refuses them, nothing
forwarded, recorded as a denial of ``<upstream>.refused_method``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ctrlrun.action import Action, Principal
from ctrlrun.decisions import decide

from .config import Upstream
from .guard import Guard
from .mcp_call import record_denied
from .mcp_messages import encode, rpc_error

log = logging.getLogger(__name__)
METHOD_NOT_FOUND = -32601  # what a server answers a method it does not serve: nothing ran


def refused_method(up: Upstream, items: Sequence[Mapping[str, Any]]) -> str | None:
    """The first method of the POST that ``refuse_methods:`` names, or None."""
    assert up.mcp is not None
    names = up.mcp.refused_methods
    return next((m["method"] for m in items if m.get("method") in names), None)


async def refuse_method(
    guard: Guard,
    up: Upstream,
    items: Sequence[Mapping[str, Any]],
    method: str,
    principal: Principal | None,
) -> tuple[int, tuple[tuple[str, str], ...], bytes, dict[str, Any]]:
    """The answer (status, headers, body) and the decision; a receipt when a principal asks."""
    action = f"{up.name}.refused_method"
    receipt_id = None
    if principal is not None:
        ctl = guard.control()
        denied = Action(action, {"method": method}, principal, None, ctl.environment)
        try:
            receipt = await decide(ctl.store, record_denied, ctl, denied, "refuse_methods")
            receipt_id = receipt.receipt_id
        except Exception as exc:  # refused all the same: nothing is forwarded
            log.error("receipt of refused MCP method %s not written: %s", method, exc)
    log.info("refused MCP %s to %s: refuse_methods", method, up.name)
    text = (
        f"ctrlrun: upstream {up.name!r} refuses {method} (its refuse_methods: names it); "
        "nothing was forwarded"
    )
    single = len(items) == 1 and "id" in items[0]
    rid = items[0].get("id") if single else None
    status = 200 if single else 403
    headers = (("Content-Type", "application/json"), ("X-Ctrlrun-Outcome", "denied"))
    decision = {"outcome": "denied", "reason": "refuse_methods", "action": action}
    return (
        status,
        headers,
        encode(rpc_error(rid, METHOD_NOT_FOUND, text)),
        {
            **decision,
            "receipt_id": receipt_id,
        },
    )
