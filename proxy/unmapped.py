"""A write no route maps, forwarded because its upstream says ``unmapped_writes: allow``."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ctrlrun.action import Action, Principal
from ctrlrun.control import Control
from ctrlrun.decisions import decide
from ctrlrun.errors import ActionFrozen

from .classify import classify
from .config import Upstream
from .forward import forward_headers
from .handled import Handled
from .refusals import refusal_for
from .routes import Request

if TYPE_CHECKING:
    from .guard import Guard

log = logging.getLogger(__name__)


async def forward(
    guard: Guard,
    ctl: Control,
    up: Upstream,
    request: Request,
    target: str,
    headers: Sequence[tuple[str, str]],
    principal: Principal,
) -> Handled:
    """Forward a write no route maps (``unmapped_writes: allow``), recorded before it goes.

    The ledger takes the proposal first: a ledger that cannot refuses the write, so
    nothing leaves unrecorded. The receipt follows with the remote's answer.
    """
    action = Action(
        f"{up.name}.unmapped_write",
        {"method": request.method, "path": request.path},
        principal,
        None,
        ctl.environment,
    )
    reason = "unmapped_writes: allow"
    try:
        await decide(ctl.store, ctl.propose_unprotected, action, reason=reason)
    except ActionFrozen as exc:  # the kill switch: recorded, nothing sent
        return guard.refused(up, request, refusal_for(exc, action=action.name))
    except Exception as exc:
        guard.metrics.store_errors.inc()
        log.error("unmapped %s %s not recorded: refused", request.method, request.path)
        return guard.refused(up, request, refusal_for(exc, action=action.name))
    reply = await guard.forwarder.send(
        up, request.method, target, forward_headers(headers), request.body
    )
    outcome = classify(up.profile, "", status=reply.status, transport=reply.transport)
    receipt_id = None
    try:
        receipt = await decide(
            ctl.store, ctl.record_unprotected, action, outcome, reason=reason, error=reply.error
        )
        receipt_id = receipt.receipt_id
    except Exception as exc:
        # It has been forwarded and its proposal is recorded: the agent gets the remote's
        # answer, and the missing receipt is said loudly.
        guard.metrics.store_errors.inc()
        log.error("receipt of unmapped %s %s not written: %s", request.method, request.path, exc)
    return Handled(reply, outcome, reason, action.name, None, receipt_id)
