"""One ``tools/call`` through the kernel: decide, reserve, forward, classify, record, answer.

The steps are the HTTP path's (``guard``), with the tool's entry in place of a route and the
JSON-RPC response in place of the status line::

    no response to the call's id arrived (cut, timed out, stream ended)   ambiguous
    nothing was sent                                                      failed
    a result                                                              committed
    a result with isError (the tool may have acted before it failed)      ambiguous
    a task created to run it (a task-augmented call: it has only begun)   ambiguous
    a JSON-RPC error the server gives before running (-32700..-32602)     failed
    any other error, or no 2xx                                            as the HTTP table

What the agent gets back is the remote's response when one arrived, else ctrlrun's tool error
(``mcp_answers``), carrying the outcome and the receipt id.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ctrlrun import ledger, tracing
from ctrlrun.action import Action, Principal, canonical_bytes
from ctrlrun.attempt import Attempt, attempt_receipt
from ctrlrun.control import Control, Outcome, build_action
from ctrlrun.decisions import decide
from ctrlrun.errors import CTRLRunError, EffectKeyError, InvalidArgument
from ctrlrun.events import EventType
from ctrlrun.receipts import Receipt

from . import replay, settle, stripe_accounts, stripe_payments
from .classify import classify
from .config import Upstream
from .decision_log import call_settled, decided_fields, traceparent
from .forward import Forwarded, forward_headers
from .guard import Guard
from .key_spellings import refuse_respelt
from .mcp_config import McpTool
from .mcp_messages import NOT_RUN_CODES, ToolCall, read_answer, response_for
from .mcp_tools import map_call
from .numbers import as_numbers
from .prepare import CREDENTIAL_HEADERS, Prepared
from .refusals import Refusal, refusal_for
from .route_values import BadInput, Request
from .stripe_recorded import as_recorded

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settled:
    """What became of one call: the remote's response, or ctrlrun's refusal, and a record."""

    decision: Mapping[str, Any]
    reply: Forwarded | None = None  # the remote's answer, when it reaches the agent
    response: Mapping[str, Any] | None = None  # the call's response inside ``reply``
    refusal: Refusal | None = None


def classify_call(reply: Forwarded, call: ToolCall) -> tuple[Outcome, Any]:
    """The record of a forwarded call, and its response if one arrived whole."""
    messages = None if reply.cut_short else read_answer(reply.headers, reply.body)
    response = None if messages is None else response_for(messages, call.request_id)
    if reply.status is None or not 200 <= reply.status <= 299:
        outcome = classify("mcp", "", status=reply.status, transport=reply.transport)
        return outcome, response
    if response is None:
        return "ambiguous", None
    if "error" in response:
        error = response["error"]
        code = error.get("code") if isinstance(error, dict) else None
        return ("failed" if code in NOT_RUN_CODES else "ambiguous"), response
    result = response.get("result")
    if isinstance(result, dict) and (result.get("isError") is True or "task" in result):
        # A task's handle (a call the client made task-augmented) says the tool has begun,
        # not that it did what it was asked: it may yet fail, or be cancelled.
        return "ambiguous", response
    return "committed", response


class CallGuard:
    """Runs tool calls of MCP upstreams through a ``Guard``'s kernel, forwarder and reconcilers."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    async def call(
        self,
        up: Upstream,
        request: Request,
        call: ToolCall,
        body: bytes,
        target: str,
        headers: Sequence[tuple[str, str]],
        principal: Principal | None,
    ) -> Settled:
        """Decide ``call`` and, if it may go, forward ``body`` (the message carrying it).

        Each call is a span of its own (a batch's calls are siblings under the agent's
        ``traceparent``), except a read tool's, which passes through as HTTP reads do.
        """
        assert up.mcp is not None
        tool = up.mcp.tools.get(call.name)
        send = _Send(self.guard, up, target, forward_headers(headers), body)
        if principal is not None and tool is not None and tool.action is None:
            reply = await send()
            return Settled({"tool": call.name, "outcome": "pass_through", "reason": "read"}, reply)
        agent = principal.agent if principal else None
        with tracing.protected("ctrlrun.tool_call", traceparent=traceparent(headers), agent=agent):
            settled = await self._decide(up, request, call, tool, send, principal)
            call_settled(settled.decision, self.guard.control)
            return settled

    async def _decide(
        self,
        up: Upstream,
        request: Request,
        call: ToolCall,
        tool: McpTool | None,
        send: _Send,
        principal: Principal | None,
    ) -> Settled:
        assert up.mcp is not None
        if principal is None:
            refusal = Refusal(
                "denied",
                "no_principal",
                "request refused: no principal (configure --principal or send Proxy-Authorization)",
            )
            return self.refused(request, call, refusal)
        ctl = self.guard.control()
        if tool is None:
            near = near_miss(call.name, up.mcp.tools)
            if near is not None and up.mcp.unmapped_tools == "allow":
                reason = f"tool {call.name!r} is spelt like {near!r}, which the map decides"
                return self.refused(request, call, Refusal("invalid_request", reason, reason))
            return await self._unmapped(ctl, up, request, call, send, principal)
        prepared = await self._prepare(ctl, up, request, tool, call, principal)
        if not isinstance(prepared, Refusal):
            template = tool.effect or ctl.policy.effect_template(prepared.action.name)
            prepared = await as_recorded(ctl, up, prepared, template)
        if isinstance(prepared, Refusal):
            return self.refused(request, call, prepared)
        admitted = await self.guard._admit(ctl, up, prepared)
        if isinstance(admitted, Refusal):
            return self.refused(request, call, admitted)
        if isinstance(admitted, replay.Claimed):  # only Stripe's Idempotency-Key replays
            raise AssertionError("a tool call carries no idempotency key to replay")
        return await self._attempt(ctl, up, request, call, prepared, admitted, send)

    def refused(self, request: Request, call: ToolCall, refusal: Refusal) -> Settled:
        self.guard.metrics.decisions.labels(refusal.action or "-", refusal.outcome).inc()
        log.info(
            "refused tools/call %s: %s (%s)",
            call.name,
            refusal.outcome,
            refusal.reason,
            extra=decided_fields(refusal, self.guard.control),
        )
        return Settled(_decision(call, refusal.outcome, refusal), refusal=refusal)

    async def _prepare(
        self,
        ctl: Control,
        up: Upstream,
        request: Request,
        tool: McpTool,
        call: ToolCall,
        principal: Principal,
    ) -> Prepared | Refusal:
        forwarder = self.guard.forwarder
        given = await stripe_accounts.derived(forwarder, up, request, tool.action, ctl.policy)
        if isinstance(given, Refusal):
            return given
        try:
            mapped = map_call(tool, call.arguments, given)
            action = build_action(
                ctl.policy, mapped.action, mapped.arguments, principal, ctl.environment
            )
        except BadInput as exc:
            return Refusal("invalid_request", exc.reason, f"tool call refused: {exc.reason}")
        except InvalidArgument as exc:
            return refusal_for(exc, action=mapped.action)
        if no_amount(ctl, action):
            reason = (
                "this refund names no amount, so Stripe would refund whatever remains, and "
                "the policy decides refunds on their amount: name the amount"
            )
            return Refusal("invalid_request", "amount_required", reason, action=action.name)
        numbers = as_numbers(ctl.policy, action.name, action.arguments)
        if isinstance(numbers, Refusal):
            return numbers
        if numbers != action.arguments:  # text spelling an integer, read as that integer
            action = build_action(ctl.policy, action.name, numbers, principal, ctl.environment)
        template = tool.effect or ctl.policy.effect_template(action.name)
        key = None
        if template is not None:
            # FastMCP's pydantic reads "042", "+42", "42.0" and "4_2" as 42, "yes" as true.
            respelt = refuse_respelt(template.names, action.arguments, action.name, flags=True)
            if respelt is not None:
                return respelt
            try:
                key = template.resolve(action.arguments, resource=action.resource)
            except EffectKeyError as exc:
                receipt = await decide(ctl.store, ctl.refuse_effect_key, action, exc)
                return refusal_for(exc, action=action.name, receipt_id=receipt.receipt_id)
        headers = request.headers
        # Without Ctrlrun-Approval the kernel finds a granted approval for the identical call.
        approval = headers.get("ctrlrun-approval")
        digest = hashlib.sha256(canonical_bytes({"tool": call.name, **call.arguments})).hexdigest()
        creds = {k: v for k, v in headers.items() if k in CREDENTIAL_HEADERS}
        return Prepared(action, key, None, approval, digest, creds)

    async def _attempt(
        self,
        ctl: Control,
        up: Upstream,
        request: Request,
        call: ToolCall,
        p: Prepared,
        attempt: Attempt,
        send: _Send,
    ) -> Settled:
        try:
            reply = await send()
        except BaseException as exc:
            await self.guard._record_lost(ctl, attempt, exc)
            if not isinstance(exc, Exception):
                raise
            log.error("tools/call %s: %s after forwarding began", call.name, type(exc).__name__)
            return self.refused(request, call, settle.failed_forwarding(p, exc))
        outcome, response = classify_call(reply, call)
        self.guard.metrics.decisions.labels(p.action.name, outcome).inc()
        error = reply.error or (None if outcome == "committed" else _error_line(reply, response))
        try:
            receipt = await decide(ctl.store, ctl.finish, attempt, outcome, error=error)
        except Exception as exc:
            log.error("tools/call %s: outcome not recorded: %s", call.name, type(exc).__name__)
            return self.refused(request, call, settle.not_recorded(p, reply, exc))
        rid = receipt.receipt_id
        if reply.status is None and outcome == "failed":
            refusal = settle.verdict(p, reply, outcome, rid)
            assert isinstance(refusal, Refusal)
            return self.refused(request, call, refusal)
        found = await self.guard._eager(ctl, up, p, attempt) if outcome == "ambiguous" else None
        if response is None:
            lost = replace(reply, cut_short=True)  # no response to this call: its reply is lost
            refusal = settle.verdict(p, lost, "ambiguous", rid, found)
            assert isinstance(refusal, Refusal)
            return self.refused(request, call, refusal)
        decision = _decision(call, outcome, None, p, rid)
        return Settled(decision, reply, response)

    async def _unmapped(
        self,
        ctl: Control,
        up: Upstream,
        request: Request,
        call: ToolCall,
        send: _Send,
        principal: Principal,
    ) -> Settled:
        """A tool the map does not know: denied (the default) or forwarded, with a receipt."""
        assert up.mcp is not None
        action = Action(
            f"{up.name}.unmapped_tool", {"tool": call.name}, principal, None, ctl.environment
        )
        if up.mcp.unmapped_tools == "deny":
            reason = f"tool {call.name!r} is not in the tools: of upstream {up.name!r}"
            receipt = await decide(ctl.store, record_denied, ctl, action, "unmapped_tool")
            refusal = Refusal(
                "denied", "unmapped_tool", reason, action.name, receipt_id=receipt.receipt_id
            )
            return self.refused(request, call, refusal)
        try:  # recorded before it leaves, as unmapped HTTP writes are (and the switch holds)
            await decide(ctl.store, ctl.propose_unprotected, action, reason="unmapped_tools: allow")
        except Exception as exc:
            return self.refused(request, call, refusal_for(exc, action=action.name))
        reply = await send()
        outcome, response = classify_call(reply, call)
        receipt_id = None
        try:
            receipt = await decide(
                ctl.store, ctl.record_unprotected, action, outcome, reason="unmapped_tools: allow"
            )
            receipt_id = receipt.receipt_id
        except CTRLRunError as exc:
            log.error("receipt of unmapped tool %s not written: %s", call.name, exc)
        reason = "unmapped_tools: allow"
        fields = {"outcome": outcome, "action": action.name, "reason": reason}
        log.info(
            "unmapped tool %s forwarded: %s",
            call.name,
            outcome,
            extra=tracing.decision(
                **fields, receipt_id=receipt_id, policy_hash=ctl.policy.policy_hash
            ),
        )
        return Settled({"tool": call.name, **fields, "receipt_id": receipt_id}, reply, response)


class _Send:
    """Forwarding the message that carries one call (its own POST), at most once."""

    def __init__(
        self,
        guard: Guard,
        up: Upstream,
        target: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
    ) -> None:
        self.guard, self.up, self.target, self.headers, self.body = guard, up, target, headers, body

    async def __call__(self) -> Forwarded:
        return await self.guard.forwarder.send(
            self.up, "POST", self.target, self.headers, self.body
        )


def no_amount(ctl: Control, action: Action) -> bool:
    """A refund of whatever remains, where the policy decides refunds on their amount."""
    return (
        action.name == "stripe.refund"
        and "amount" not in action.arguments
        and stripe_payments.reads(ctl.policy, action.name, "amount")
    )


def near_miss(name: str, tools: Mapping[str, McpTool]) -> str | None:
    """A mapped tool whose name ``name`` differs from only in case, spaces, '-' or '.': a
    server that matches names loosely would run it unmapped (under ``unmapped_tools: allow``)."""

    def loose(text: str) -> str:
        return "".join(c for c in text.casefold() if c.isalnum())

    return next((t for t in tools if t != name and loose(t) == loose(name)), None)


def _error_line(reply: Forwarded, response: Any) -> str:
    if reply.status is None or not 200 <= reply.status <= 299:
        return f"HTTP {reply.status}"
    if response is None:
        return "no response to the call arrived"
    if "error" in response:
        error = response["error"]
        return f"JSON-RPC error {error.get('code') if isinstance(error, dict) else '?'}"
    return "the tool answered isError"


def _decision(
    call: ToolCall,
    outcome: str,
    refusal: Refusal | None,
    p: Prepared | None = None,
    receipt_id: str | None = None,
) -> dict[str, Any]:
    if refusal is not None:
        return {
            "tool": call.name,
            "outcome": outcome,
            "reason": refusal.reason,
            "action": refusal.action,
            "effect_key": refusal.effect_key,
            "receipt_id": refusal.receipt_id,
        }
    assert p is not None
    return {
        "tool": call.name,
        "outcome": outcome,
        "action": p.action.name,
        "effect_key": p.effect_key,
        "receipt_id": receipt_id,
    }


def record_denied(ctl: Control, action: Action, reason: str) -> Receipt:
    """A denial's receipt for a call no policy rule could allow (a tool the map does not know)."""
    now = ctl.clock()
    attempt = Attempt(action, None, 0, "deny", reason, ctl.policy.policy_hash, now)
    with ctl.store.transaction() as conn:
        data = {"action_hash": action.hash}
        ledger.append_event(
            conn, now, EventType.ACTION_PROPOSED, action_id=action.action_id, data=data
        )
        ledger.append_event(
            conn, now, EventType.ACTION_DENIED, action_id=action.action_id, data={"reason": reason}
        )
        return attempt_receipt(conn, attempt, "denied", None, now)
