"""The proxy's side of decision logs and traces (``ctrlrun.tracing``): one span per protected
request or MCP tool call, parented on the agent's ``traceparent``, and the fields of the
decisions the proxy logs itself (its refusals, the apiserver's answer to a dry run)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from ctrlrun import tracing

from . import relay
from .handled import Handled
from .refusals import Refusal


def traceparent(headers: Sequence[tuple[str, str]]) -> str | None:
    """The agent's ``traceparent``; none when it sent several (W3C: then it has no parent)."""
    values = [v for k, v in headers if k.lower() == "traceparent"]
    return values[0] if len(values) == 1 else None


async def traced(
    protected: Awaitable[Handled | relay.Relayed],
    headers: Sequence[tuple[str, str]],
    control: Callable[[], Any],
    *,
    agent: str | None = None,
) -> Handled | relay.Relayed:
    """Await the protected path inside its span; note the decision it answered with."""
    with tracing.protected("ctrlrun.request", traceparent=traceparent(headers), agent=agent):
        got = await protected
        answered(got, policy_hash(control))
        return got


def decided_fields(decided: Refusal | Handled, control: Callable[[], Any]) -> dict[str, Any]:
    """``extra=`` for the line of a decision the proxy took itself, a refusal or a request it
    handled (the kernel logs its own decisions)."""
    return tracing.decision(
        action=decided.action,
        effect_key=decided.effect_key,
        outcome=decided.outcome,
        reason=decided.reason,
        receipt_id=decided.receipt_id,
        policy_hash=policy_hash(control),
    )


def call_settled(decision: Mapping[str, Any], control: Callable[[], Any]) -> None:
    """Note a tool call's decision (``mcp_call.Settled.decision``) on its span."""
    fields = ("action", "effect_key", "outcome", "reason", "receipt_id")
    tracing.note(**{k: decision.get(k) for k in fields}, policy_hash=policy_hash(control))


def answered(result: Handled | relay.Relayed, policy_hash: str | None) -> None:
    """Note the request's final decision on its span (a relayed stream: still executing)."""
    if isinstance(result, relay.Relayed):
        p = result.prepared
        tracing.note(action=p.action.name, effect_key=p.effect_key, outcome="executing")
        return
    tracing.note(
        action=result.action,
        effect_key=result.effect_key,
        outcome=result.outcome,
        reason=result.reason,
        receipt_id=result.receipt_id,
        policy_hash=policy_hash,
    )


def policy_hash(control: Callable[[], Any]) -> str | None:
    """The policy in force, for the record; none if the control cannot be had (logged apart)."""
    try:
        return str(control().policy.policy_hash)
    except Exception:  # the refusal stands; a log field is not worth a second failure
        return None
