"""A Kubernetes workload write through the guard: the apiserver's dry run says which action it
is (``kube_result``), then the protected path runs that action.

Both steps run inside the request's span (``decision_log.traced``): a write the dry run
refuses, or answers itself (the apiserver refused it, or it would change nothing), is a span
and a decision line like any other, named for the action the write is (``k8s.scale`` on
``/scale``, else ``k8s.update_<kind>``). A refusal also leaves a receipt, as a request refused
before the policy saw it does; the apiserver's own answer does not (it decided, not ctrlrun).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ctrlrun.action import Principal

from . import kube_result, relay
from .config import Upstream
from .decision_log import decided_fields
from .handled import Handled
from .refusals import Refusal
from .route_values import KubeWrite, Mapped, Request

if TYPE_CHECKING:
    from .guard import Guard

log = logging.getLogger(__name__)


def action_of(write: KubeWrite) -> str:
    """The action a workload write is, before the dry run says which of its kind's."""
    return "k8s.scale" if write.scale else kube_result.update_action(write)


async def protected(
    guard: Guard,
    up: Upstream,
    request: Request,
    write: KubeWrite,
    target: str,
    headers: Sequence[tuple[str, str]],
    principal: Principal | None,
) -> Handled | relay.Relayed:
    """Decide ``write`` on the apiserver's dry run, then run it as the action decided."""
    got = await kube_result.resolve(guard.forwarder, up, request, write, target, headers)
    if isinstance(got, kube_result.Answered):
        handled = Handled(got.reply, got.outcome, got.reason, action_of(write))
        guard.metrics.decisions.labels(handled.action or "-", handled.outcome).inc()
        log.info(
            "%s %s: %s (%s)",
            request.method,
            request.path,
            got.outcome,
            got.reason,
            extra=decided_fields(handled, guard.control),
        )
        return handled
    if isinstance(got, Refusal):  # a decision too: it leaves a receipt, as a screen refusal does
        named = Mapped(action_of(write), dict(write.arguments))
        return await guard._receipted(up, request, named, got, principal)
    return await guard.protected(up, got.request, got.mapped, got.target, headers, principal)
