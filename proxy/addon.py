"""The mitmproxy addon: recognise requests to configured upstreams and guard their writes.

The hook only gathers facts and applies the guard's answer, and records the decision in
``flow.metadata["ctrlrun"]``. mitmproxy forwards a request whose hook raised, so every error
here is caught and refused: the protected path fails closed.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from typing import Any

from mitmproxy import connection, http, tcp
from mitmproxy.proxy.mode_specs import TransparentMode

from ctrlrun.action import Principal

from . import relay
from .answers import answer
from .classify import Transport
from .config import Upstream
from .credentials import UpstreamTokens
from .framing import NO_READ_HEADERS, UNSENDABLE_BYTES
from .gate import Asked, Gate, Passage
from .guard import Guard
from .handled import Handled
from .kube_proxies import through_proxy
from .mcp_gate import McpGate, internal_error
from .mcp_sessions import HEADER
from .principal import Principals
from .refusals import Refusal
from .route_values import OVERRIDE_PARAMETER, READ_METHOD_BYTES, READ_METHODS
from .routes import PassThrough, Request
from .tunnels import host_of

log = logging.getLogger(__name__)
METADATA = "ctrlrun"  # flow.metadata key of the decision
RELAY = "ctrlrun.relay"  # flow.metadata key of a stream write mitmproxy relays, until settled


class CtrlrunAddon:
    """Routes flows to the guard; everything that is not a configured upstream passes by.

    Which upstream a flow is for is the gate's answer (where it really goes), never the
    spelling of its host. ``Proxy-Authorization`` is taken off every request before anything
    else sees it: it names the agent to ctrlrun and never reaches a remote.
    """

    def __init__(
        self,
        guard: Guard,
        gate: Gate,
        upstreams: Sequence[Upstream],
        principals: Principals,
        reverse_specs: dict[str, str],
    ) -> None:
        self.guard, self.gate = guard, gate
        self.principals = principals
        self.by_name = {u.name: u for u in upstreams}
        self.reverse_specs = reverse_specs  # mode spec -> upstream name
        self.auth: dict[str, str] = {}  # client connection id -> Proxy-Authorization
        self.tunnels: dict[str, str] = {}  # client connection id -> the host its CONNECT named
        self.mcp = McpGate(guard)
        self.tokens = UpstreamTokens(upstreams)
        self.flow_auth: weakref.WeakKeyDictionary[http.HTTPFlow, str] = weakref.WeakKeyDictionary()

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        # Through HTTPS_PROXY the credential is on the CONNECT, not on the requests inside it.
        value = flow.request.headers.get("proxy-authorization")
        if value:
            self.auth[flow.client_conn.id] = value
        req = flow.request
        try:
            asked = Asked("CONNECT", req.host, req.port, principal=self._principal(flow))
            passage = await self.gate.passage(asked)
        except Exception as exc:  # fail closed: an unchecked tunnel could reach an upstream
            log.exception("internal error on CONNECT %s:%s: refused", req.host, req.port)
            _refuse_internal(flow, None, exc)
            return
        if passage.refusal is not None:
            _refuse(flow, passage, "http")
            return
        self.tunnels[flow.client_conn.id] = req.host
        if passage.upstream is None and passage.dial is not None:
            req.data.host = passage.dial  # pinned: the address just checked, not a new lookup
        # A tunnel to an upstream keeps its host (the client checks the certificate): intercepted.

    async def tcp_start(self, flow: tcp.TCPFlow) -> None:
        # A transparent connection that is not HTTP has no request for the gate to judge:
        # judge its destination here, before anything is sent to it.
        if not isinstance(flow.client_conn.proxy_mode, TransparentMode):
            return
        host, port = flow.server_conn.address[:2] if flow.server_conn.address else ("", 0)
        try:
            passage = await self.gate.passage(Asked("TCP", str(host), int(port)))
        except Exception:  # fail closed
            log.exception("internal error on a transparent connection to %s:%s", host, port)
            flow.kill()
            return
        if passage.refusal is not None:
            flow.kill()

    def client_disconnected(self, client: connection.Client) -> None:
        self.auth.pop(client.id, None)
        self.tunnels.pop(client.id, None)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        self._take_auth(flow)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        # Only what mitmproxy forwards itself gets here (ctrlrun's own answers are set in
        # ``request``): reads of upstreams and everything else. They are relayed as they
        # arrive, never held whole: a watch only ends when the server ends it.
        # A relayed stream write's answer (a 101, or a short refusal) is held instead, so that
        # ``response`` records it before any of it reaches the agent.
        if flow.response is not None and RELAY not in flow.metadata:
            flow.response.stream = True
        decision = flow.metadata.get(METADATA)
        if flow.response is not None and isinstance(decision, dict) and decision.get("mcp"):
            # Before the agent reads the answer: the session it assigns is known when the
            # agent's DELETE of it arrives (``mcp_sessions``).
            req, res = flow.request, flow.response
            self.mcp.sessions.answered(
                decision["upstream"],
                req.method.upper(),
                req.path.split("?", 1)[0],
                res.status_code,
                asked=req.headers.get(HEADER),
                given=res.headers.get(HEADER),
            )

    async def response(self, flow: http.HTTPFlow) -> None:
        pending = flow.metadata.get(RELAY)
        if isinstance(pending, relay.Relayed) and not pending.settled and flow.response:
            await self._settle(flow, pending, flow.response.status_code, None, None)

    async def error(self, flow: http.HTTPFlow) -> None:
        pending = flow.metadata.get(RELAY)
        if not isinstance(pending, relay.Relayed) or pending.settled:
            return
        server = flow.server_conn
        # Nothing left before the connection (and its TLS, if any) was up.
        sent = server.timestamp_tcp_setup is not None and (
            server.tls is False or server.timestamp_tls_setup is not None
        )
        transport = Transport.SENT_NO_STATUS if sent else Transport.NOT_SENT
        message = flow.error.msg if flow.error else "no answer"
        await self._settle(flow, pending, None, transport, f"proxy relay: {message}"[:300])

    async def _settle(
        self,
        flow: http.HTTPFlow,
        pending: relay.Relayed,
        status: int | None,
        transport: Transport | None,
        error: str | None,
    ) -> None:
        try:
            settled = await relay.settle(pending, status, transport, error)
        except Exception as exc:  # never let a hook raise: mitmproxy would carry on regardless
            log.exception("internal error settling %s: refused", pending.action)
            _refuse_internal(flow, pending.upstream, exc)
            return
        decision = flow.metadata[METADATA]
        if isinstance(settled, Refusal):
            _apply(
                flow, pending.upstream, self.guard.refused(pending.upstream, facts(flow), settled)
            )
            return
        outcome, decision["receipt_id"] = settled
        decision["outcome"] = outcome
        self.guard.metrics.decisions.labels(pending.action, outcome).inc()

    async def request(self, flow: http.HTTPFlow) -> None:
        self._take_auth(flow)
        if flow.response or flow.error or not flow.live:
            return  # answered or ended by someone else (another addon, a replay, a kill)
        upstream = None
        try:
            upstream = await self._upstream(flow)
            if upstream is None or flow.response is not None:
                return  # not ours (mitmproxy forwards it), or refused by the gate
            self.tokens.apply(flow.request.headers, upstream)
            if upstream.mcp is not None:
                await self._mcp(flow, upstream)
                return
            if _is_read(flow.request) and not through_proxy(upstream, flow.request.path):
                _record(flow, upstream, {"outcome": "pass_through", "reason": "read"})
                return  # reads always pass through, whatever the ledger's health
            result = await self.guard.handle(
                upstream,
                facts(flow),
                target=flow.request.path,
                headers=list(flow.request.headers.items(multi=True)),
                principal=self._principal(flow),
            )
            if isinstance(result, PassThrough):
                _record(flow, upstream, {"outcome": "pass_through", "reason": result.reason})
                return
            if isinstance(result, relay.Relayed):
                _relay(flow, result)
                return  # mitmproxy forwards it; ``response`` or ``error`` settles the record
            _apply(flow, upstream, result)
        except Exception as exc:  # fail closed: mitmproxy would forward on an exception
            log.exception(
                "internal error on %s %s: refused", flow.request.method, flow.request.path
            )
            _refuse_internal(flow, upstream, exc)

    async def _mcp(self, flow: http.HTTPFlow, upstream: Upstream) -> None:
        """An MCP upstream: only its tool calls are decided; the rest passes, streamed."""
        got = await self.mcp.handle(
            upstream,
            facts(flow),
            target=flow.request.path,
            headers=list(flow.request.headers.items(multi=True)),
            principal=self._principal(flow),
        )
        if isinstance(got, PassThrough):
            _record(flow, upstream, {"outcome": "pass_through", "reason": got.reason, "mcp": True})
            return
        flow.response = to_response(got.status, got.headers, got.body)
        _record(flow, upstream, {"outcome": "tool_calls", "calls": list(got.decisions)})

    async def _upstream(self, flow: http.HTTPFlow) -> Upstream | None:
        """The upstream the flow really goes to; refuses the flow when the gate says so."""
        req = flow.request
        absolute = host_of(req.authority) if req.http_version.startswith("HTTP/1") else None
        if absolute:  # sent on in origin-form: a server reads the Host judged, not this name
            req.authority = ""
        spec = getattr(flow.client_conn.proxy_mode, "full_spec", "")
        if spec in self.reverse_specs:
            return self.by_name[self.reverse_specs[spec]]
        names = [n for n in (host_of(req.host_header), absolute, flow.client_conn.sni) if n]
        host = req.host
        if names and isinstance(flow.client_conn.proxy_mode, TransparentMode):
            # The kernel redirected a connection to an address; the request names where it
            # means to go. Judge that name, and the address must be the same place.
            host, names = names[0], [host, *names[1:]]
        asked = Asked(
            req.method.upper(),
            host,
            req.port,
            req.path,
            names,
            self._principal(flow),
            self.tunnels.get(flow.client_conn.id),
        )
        passage = await self.gate.passage(asked)
        if passage.refusal is not None:
            profile = passage.upstream.profile if passage.upstream else "http"
            _refuse(flow, passage, profile)
        elif passage.upstream is not None:
            req.data.host = passage.upstream.host  # a read goes where the upstream is
        elif passage.dial is not None:
            req.data.host = passage.dial  # pinned: the address just checked, not a new lookup
        return passage.upstream

    def _take_auth(self, flow: http.HTTPFlow) -> None:
        values = flow.request.headers.get_all("proxy-authorization")
        if values:
            del flow.request.headers["proxy-authorization"]
            self.flow_auth[flow] = values[0]

    def _principal(self, flow: http.HTTPFlow) -> Principal | None:
        header = self.flow_auth.get(flow) or self.auth.get(flow.client_conn.id)
        return self.principals.resolve(header)


def _refuse(flow: http.HTTPFlow, passage: Passage, profile: str) -> None:
    refusal = passage.refusal
    assert refusal is not None
    a = refusal.answer(profile)
    flow.response = to_response(a.status, a.headers, a.body)
    name = passage.upstream.name if passage.upstream else None
    flow.metadata[METADATA] = {
        "upstream": name,
        "outcome": refusal.outcome,
        "reason": refusal.reason,
        "receipt_id": refusal.receipt_id,
    }


def _is_read(req: http.Request) -> bool:
    """``hidden_write(...) is None`` on the raw request (mitmproxy's lookups cost reads more)."""
    if req.data.method not in READ_METHOD_BYTES or req.raw_content or req.trailers:
        return False  # a read with a body (or trailers) is refused by the guard
    for name, value in req.headers.fields:  # a Content-Length: the guard's (``unframed``)
        lower = name.lower()
        if lower in NO_READ_HEADERS or b"\n" in value or b"\r" in value:
            return False
        if lower == b"connection" and b"upgrade" in value.lower():  # hidden_write's
            return False
    path = req.data.path
    if UNSENDABLE_BYTES.search(path):
        return False  # over HTTP/2 a target can hold a CR LF: the guard refuses it
    if b"#" in path:
        return False  # the guard refuses it: servers differ on what a '#' in a target is
    if b"%" in path or OVERRIDE_PARAMETER.encode() in path:  # "%5Fmethod" is "_method" too
        return OVERRIDE_PARAMETER not in req.query
    return True


def facts(flow: http.HTTPFlow) -> Request:
    """What the guard needs to know of a flow's request (the body as it will be forwarded)."""
    req = flow.request
    names = [k.lower() for k in req.headers.keys(multi=True)]
    # A read is GET, HEAD or OPTIONS as spelt: "get" is not GET to Go's ServeMux or to a
    # handler testing r.Method == "GET", so it stays as sent (mitmproxy's ``method`` is
    # upper-cased, and the method forwarded is the one sent) and is judged as no read.
    method = req.method
    if method in READ_METHODS:
        method = req.data.method.decode("utf-8", "surrogateescape")
    return Request(
        method=method,
        path=req.path.split("?", 1)[0],
        query={k: req.query.get_all(k) for k in req.query},
        headers={k.lower(): v for k, v in req.headers.items(multi=True)},
        body=req.raw_content if req.raw_content is not None else b"",
        repeated=frozenset(name for name in names if names.count(name) > 1),
        folded=frozenset(
            k.decode("latin-1").lower() for k, v in req.headers.fields if b"\n" in v or b"\r" in v
        ),
        # mitmproxy's query ends at a '#', the target forwarded does not (``unreadable``).
        fragment="#" in req.path,
        raw_query=req.path.partition("?")[2],
        trailers=bool(req.trailers),
    )


def _apply(flow: http.HTTPFlow, upstream: Upstream, handled: Handled) -> None:
    got = handled.response
    flow.response = to_response(got.status or 502, got.headers, got.body)
    _record(
        flow,
        upstream,
        {
            "outcome": handled.outcome,
            "reason": handled.reason,
            "action": handled.action,
            "effect_key": handled.effect_key,
            "receipt_id": handled.receipt_id,
        },
    )


def _relay(flow: http.HTTPFlow, pending: relay.Relayed) -> None:
    """Let mitmproxy forward an admitted stream write, without ctrlrun's or the proxy's headers."""
    headers = flow.request.headers
    for name in {k.lower() for k in headers}:
        if name == "proxy-authorization" or name.startswith("ctrlrun-"):
            del headers[name]
    flow.metadata[RELAY] = pending
    p = pending.prepared
    decision = {"outcome": "executing", "reason": "relayed", "action": p.action.name}
    _record(flow, pending.upstream, {**decision, "effect_key": p.effect_key, "receipt_id": None})


def _refuse_internal(flow: http.HTTPFlow, upstream: Upstream | None, exc: Exception) -> None:
    if upstream is not None and upstream.mcp is not None:
        got = internal_error(exc)
        flow.response = to_response(got.status, got.headers, got.body)
        flow.metadata[METADATA] = {"upstream": upstream.name, **got.decisions[0]}
        return
    a = answer(
        upstream.profile if upstream else "http",
        "unavailable",
        reason="internal_error",
        message=f"internal error ({type(exc).__name__})",
        action=None,
        effect_key=None,
        receipt_id=None,
    )
    flow.response = to_response(a.status, a.headers, a.body)
    decision = {"outcome": "unavailable", "reason": "internal_error"}
    flow.metadata[METADATA] = {"upstream": upstream.name if upstream else None, **decision}


def _record(flow: http.HTTPFlow, upstream: Upstream, decision: dict[str, Any]) -> None:
    flow.metadata[METADATA] = {"upstream": upstream.name, **decision}


def to_response(status: int, headers: Sequence[tuple[str, str]], body: bytes) -> http.Response:
    """A response carrying ``body`` as is (already encoded as its headers say)."""
    response = http.Response.make(status, b"")
    response.headers = http.Headers(
        [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in headers
            if k.lower() != "content-length"
        ]
    )
    response.raw_content = body
    response.headers["content-length"] = str(len(body))
    return response
