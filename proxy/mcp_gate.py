"""Requests to an MCP upstream (Streamable HTTP): only ``tools/call`` is decided.

Every request that carries no ``tools/call`` passes through untouched and streamed (GET
streams, ``initialize``, ``tools/list``, notifications, responses, pings), and so does a
session's DELETE, when it names a session the server assigned on its path (``mcp_sessions``).
A POST that does carry one is read strictly (``mcp_messages``); what ctrlrun cannot read with
certainty is answered with a JSON-RPC error and nothing is forwarded. Each call goes through
the kernel (``mcp_call``); a batch is split, each of its messages forwarded as its own POST
(the tool calls that may go, and the other messages), and the answers gathered in order into
one JSON array, ctrlrun's own in place of the calls it refused.

Each tool call is forwarded with a JSON-RPC id of ctrlrun's own (``mcp_ids``), so no other
request, of any session or of none, in flight or cut short, can be answered in its place: a
server routes answers by id, and a call's record would be another request's answer. Nothing
is held by id, so nothing passed through (a stream that never ends) holds up a later request.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ctrlrun.action import Principal

from .answers import _message
from .config import Upstream
from .forward import Forwarded, forward_headers
from .framing import unframed
from .guard import Guard
from .mcp_call import CallGuard, Settled
from .mcp_ids import reserved, restore, swap, wire_id, wired
from .mcp_messages import (
    INTERNAL_ERROR,
    ProtocolError,
    encode,
    is_tool_call,
    load_messages,
    read_answer,
    response_for,
    rpc_error,
    tool_call,
    tool_error,
)
from .mcp_methods import refuse_method, refused_method
from .mcp_sessions import HEADER, Sessions, header
from .refusals import Refusal
from .route_values import (
    BODY_HEADERS,
    MAX_BODY,
    READ_METHODS,
    PassThrough,
    Request,
    overridden,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class McpHandled:
    """ctrlrun's answer to a POST carrying tool calls, and the decision on each call."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    decisions: tuple[Mapping[str, Any], ...]


class McpGate:
    """Decides the tool calls in requests to MCP upstreams; see the module docstring."""

    def __init__(self, guard: Guard, sessions: Sessions | None = None) -> None:
        self.guard = guard
        self.calls = CallGuard(guard)
        self.sessions = sessions if sessions is not None else Sessions()

    async def handle(
        self,
        up: Upstream,
        request: Request,
        *,
        target: str,
        headers: Sequence[tuple[str, str]],
        principal: Principal | None,
    ) -> McpHandled | PassThrough:
        method = request.method.upper()
        unsure = _unsure(request)
        if unsure is not None:
            return _protocol(ProtocolError(-32600, unsure))
        if request.method == "DELETE":
            # MCP's DELETE ends a session the server assigned there; any other may be another
            # API's write on the same host.
            refusal = self.sessions.refusal(up.name, request)
            if refusal is not None:
                return _protocol(ProtocolError(-32600, refusal))
            return PassThrough("the end of a session the server assigned")
        if request.method != "POST":
            if request.method in READ_METHODS and not request.body:
                return PassThrough(f"{request.method} carries no MCP message")
            return _protocol(ProtocolError(-32600, f"ctrlrun relays no {method} with a body"))
        try:
            if len(request.body) > MAX_BODY:
                raise ProtocolError(-32600, f"the body is over {MAX_BODY} bytes")
            for name in sorted(BODY_HEADERS & request.repeated):
                # Node keeps the first of two, ctrlrun reads the last: the TypeScript SDK's
                # server decodes the body in the first one's charset (UTF-7 included).
                raise ProtocolError(-32600, f"the header {name} is sent more than once")
            messages = load_messages(request.body, request.headers)
        except ProtocolError as exc:
            return _protocol(exc)
        batch = isinstance(messages, list)
        items = messages if isinstance(messages, list) else [messages]
        refused = refused_method(up, items)
        if refused is not None:
            status, hdrs, body, decision = await refuse_method(
                self.guard, up, items, refused, principal
            )
            return McpHandled(status, hdrs, body, (decision,))
        own = reserved(items)
        if own is not None:
            return _protocol(ProtocolError(-32600, own))
        if not any(is_tool_call(m) for m in items):
            return PassThrough("no tools/call")
        self.guard.active += 1
        try:
            if not batch:
                return await self._single(up, request, items[0], target, headers, principal)
            return await self._batch(up, request, items, target, headers, principal)
        finally:
            self.guard.active -= 1

    async def _single(
        self,
        up: Upstream,
        request: Request,
        message: dict[str, Any],
        target: str,
        headers: Sequence[tuple[str, str]],
        principal: Principal | None,
    ) -> McpHandled:
        try:
            call = tool_call(message)
        except ProtocolError as exc:
            return _protocol(exc, status=200 if exc.request_id is not None else 400)
        wire = wire_id()
        body = wired(message, wire)
        on_wire = replace(call, request_id=wire)
        settled = await self.calls.call(up, request, on_wire, body, target, headers, principal)
        if settled.reply is not None:
            got = settled.reply
            self.saw(up, request, got)
            body = restore(got.headers, got.body, wire, call.request_id)
            return McpHandled(got.status or 502, got.headers, body, (settled.decision,))
        assert settled.refusal is not None
        answer = tool_error(call.request_id, tool_text(settled.refusal), _meta(settled))
        return _json(answer, (settled.decision,), settled.refusal.outcome)

    async def _batch(
        self,
        up: Upstream,
        request: Request,
        items: list[dict[str, Any]],
        target: str,
        headers: Sequence[tuple[str, str]],
        principal: Principal | None,
    ) -> McpHandled:
        """Each message of the batch on its own POST, in order; the answers as one array."""
        ids = [m.get("id") for m in items if "id" in m and "method" in m]
        if len({json.dumps(i) for i in ids}) != len(ids):
            return _protocol(ProtocolError(-32600, "two requests of the batch share an id"))
        try:
            calls = [tool_call(m) if is_tool_call(m) else None for m in items]
        except ProtocolError as exc:
            return _protocol(exc)
        answers: list[Any] = []
        decisions: list[Mapping[str, Any]] = []
        for message, call in zip(items, calls, strict=True):
            if call is None:
                reply = await self._relay(up, target, headers, encode(message))
                self.saw(up, request, reply)
                answers.extend(_answers_to(message, reply))
                continue
            wire = wire_id()
            on_wire = replace(call, request_id=wire)
            body = wired(message, wire)
            settled = await self.calls.call(up, request, on_wire, body, target, headers, principal)
            decisions.append(settled.decision)
            if settled.reply is not None:
                self.saw(up, request, settled.reply)
            if settled.response is not None:
                answers.append(swap(settled.response, call.request_id))
            elif settled.reply is not None:  # a read tool's, passed through
                answers.extend(_answers_to({**message, "id": wire}, settled.reply, call.request_id))
            else:
                assert settled.refusal is not None
                text = tool_text(settled.refusal)
                answers.append(tool_error(call.request_id, text, _meta(settled)))
        if not answers:
            return McpHandled(202, (), b"", tuple(decisions))
        return _json(answers, tuple(decisions), None)

    async def _relay(
        self, up: Upstream, target: str, headers: Sequence[tuple[str, str]], body: bytes
    ) -> Forwarded:
        """A batch's other message, forwarded alone as it would have been inside the batch."""
        return await self.guard.forwarder.send(up, "POST", target, forward_headers(headers), body)

    def saw(self, up: Upstream, request: Request, reply: Forwarded) -> None:
        """A POST ctrlrun forwarded itself was answered: learn the session it may name."""
        given = header(reply.headers, HEADER)
        self.sessions.answered(up.name, "POST", request.path, reply.status, asked=None, given=given)


def _unsure(request: Request) -> str | None:
    """Why the server may read ``request`` otherwise than ctrlrun does, or None."""
    if request.folded:
        return "ctrlrun relays no header folded over lines"
    unsent = unframed(request)
    if unsent is not None:
        return unsent
    if "upgrade" in request.headers or overridden(request.headers, request.query):
        # The server may honour either and run what ctrlrun did not read as a message.
        return "ctrlrun relays no Upgrade or method override"
    if HEADER in request.repeated:
        # The mcp SDK reads the first, ctrlrun the last: which session a call ran in would
        # be another than the one the server serves.
        return "a request that names two Mcp-Session-Ids"
    return None


def _answers_to(message: Mapping[str, Any], reply: Forwarded, agents: Any = None) -> list[Any]:
    """The response to a relayed request of a batch (notifications and responses have none),
    under the agent's id ``agents`` when it was forwarded with another."""
    if "id" not in message or "method" not in message:
        return []
    original = message["id"] if agents is None else agents
    messages = read_answer(reply.headers, reply.body) or []
    response = response_for(messages, message["id"])
    if response is not None:
        return [swap(response, original)]
    what = f"HTTP {reply.status}" if reply.status else (reply.error or "no answer")
    text = f"ctrlrun: the server's answer was lost ({what})"
    return [rpc_error(original, INTERNAL_ERROR, text)]


def tool_text(refusal: Refusal) -> str:
    """What the model reads: ``ctrlrun: <what happened>. <what to do next>.``"""
    if refusal.outcome == "approval_required":
        approval = refusal.request_id or "apr_…"
        then = (
            "then make the identical tool call again, once (a changed call is a new one)"
            if refusal.resend
            else f"then send the call with HTTP header Ctrlrun-Approval: {approval} (this "
            "action's policy says approval: header)"
        )
        return (
            f"ctrlrun: {refusal.message}. A human must approve it: run 'ctrlrun approve "
            f"{approval}'; {then}."
        )
    if refusal.outcome == "approval_invalid":
        return (
            f"ctrlrun: {refusal.message.rstrip('. ')}. Nothing was forwarded; make exactly "
            "the tool call the approval was granted for, or ask for a new approval."
        )
    return _message(
        refusal.outcome,
        refusal.message,
        effect_key=refusal.effect_key,
        request_id=None,
        resend=refusal.resend,
    )


def _meta(settled: Settled) -> dict[str, Any]:
    refusal = settled.refusal
    assert refusal is not None
    meta = {
        "outcome": refusal.outcome,
        "reason": refusal.reason,
        "action": refusal.action,
        "effect_key": refusal.effect_key,
        "receipt_id": refusal.receipt_id,
    }
    if refusal.request_id is not None:
        meta["request_id"] = refusal.request_id
    return meta


def _json(
    payload: Any, decisions: tuple[Mapping[str, Any], ...], outcome: str | None
) -> McpHandled:
    headers = [("Content-Type", "application/json")]
    if outcome is not None:
        headers.append(("X-Ctrlrun-Outcome", outcome))
    return McpHandled(200, tuple(headers), encode(payload), decisions)


def _protocol(exc: ProtocolError, *, status: int = 400) -> McpHandled:
    """A JSON-RPC error for a message ctrlrun cannot read: nothing was forwarded."""
    log.info("refused MCP request: %s", exc.message)
    text = f"ctrlrun: {exc.message}; nothing was forwarded"
    decision = {"outcome": "invalid_request", "reason": exc.message}
    return McpHandled(
        status,
        (("Content-Type", "application/json"), ("X-Ctrlrun-Outcome", "invalid_request")),
        encode(rpc_error(exc.request_id, exc.code, text)),
        (decision,),
    )


def internal_error(exc: Exception) -> McpHandled:
    """The answer when ctrlrun itself failed on an MCP request: refused, nothing forwarded."""
    refused = _protocol(ProtocolError(INTERNAL_ERROR, f"internal error ({type(exc).__name__})"))
    decision = {"outcome": "unavailable", "reason": "internal_error"}
    return McpHandled(503, refused.headers, refused.body, (decision,))
