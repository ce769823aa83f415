"""A fake Stripe MCP server: the official ``mcp`` SDK's FastMCP, tools over a FakeStripe.

Each tool makes the REST request Stripe's own MCP server would make, answered by the given
:class:`FakeStripe` (its state, its idempotency, its refusals), so a refund made through this
server is one that ``GET /v1/refunds`` on the fake's REST side lists, and the Stripe
reconciler finds it. Requests must carry ``Authorization: Bearer sk_test_…`` as Stripe's
server requires. ``fail_next`` arms failures for the next ``tools/call`` POSTs::

    commit_then_drop   the tool runs; the answer's status line is sent, then the connection
                       is cut (the agent's reply is lost)
    commit_then_500    the tool runs; the answer is a 500
    hang               nothing runs; the connection stays silent for ``hang_seconds``, then cut
    tool_error         nothing runs; the answer is a tool result with isError
    <HTTP status>      nothing runs; the answer is that status
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Literal, TypeAlias
from urllib.parse import urlencode

import uvicorn
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings

from ..messages import Request
from ..stripe import FakeStripe

McpFailure: TypeAlias = Literal["commit_then_drop", "commit_then_500", "hang", "tool_error"] | int
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
_MODES = ("commit_then_drop", "commit_then_500", "hang", "tool_error")


class _Cut(Exception):
    """Raised after a response began: uvicorn then closes the connection mid-answer."""


class FakeStripeMcp:
    """See the module docstring. ``json_response``: answer POSTs with JSON instead of SSE."""

    def __init__(
        self,
        stripe: FakeStripe,
        *,
        host: str = "127.0.0.1",
        json_response: bool = False,
        hang_seconds: float = 30.0,
    ) -> None:
        self.stripe = stripe
        self.host = host
        self.hang_seconds = hang_seconds
        self.received: list[bytes] = []  # every POST body, as it arrived
        self.requests: list[tuple[str, str]] = []  # every request's method and path
        self._lock = threading.Lock()
        self._failures: list[McpFailure] = []
        self._port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.mcp = FastMCP(
            "stripe",
            json_response=json_response,
            # FastMCP configures the root logger when a process has none (a demo): quietly.
            log_level="WARNING",
            streamable_http_path="/",
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        _add_tools(self.mcp, self)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    def fail_next(self, mode: McpFailure | None, times: int = 1) -> None:
        """Arm ``mode`` for the next ``times`` tool calls; None clears."""
        with self._lock:
            if mode is None:
                self._failures.clear()
                return
            if mode not in _MODES and not (isinstance(mode, int) and 400 <= mode <= 599):
                raise ValueError(f"unknown MCP failure mode: {mode!r}")
            self._failures.extend([mode] * times)

    def _take(self) -> McpFailure | None:
        with self._lock:
            return self._failures.pop(0) if self._failures else None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FakeStripeMcp:
        sock = socket.socket()
        sock.bind((self.host, 0))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._asgi(self.mcp.streamable_http_app()), log_level="critical", lifespan="on"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        for _ in range(200):  # bounded: at most 10 s
            if self._server.started:
                return self
            threading.Event().wait(0.05)
        raise RuntimeError("the fake Stripe MCP server did not start")

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(15)
        self._server = self._thread = None

    def __enter__(self) -> FakeStripeMcp:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- failures, in front of the SDK's app ------------------------------------------------

    def _asgi(self, app: ASGIApp) -> ASGIApp:
        async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                self.requests.append((scope["method"], scope["path"]))
            if scope["type"] != "http" or scope["method"] != "POST":
                return await app(scope, receive, send)
            body = await _read_body(receive)
            self.received.append(body)
            mode = self._take() if _is_tool_call(body) else None
            await self._answer(app, scope, _replay(body), send, mode)

        return asgi

    async def _answer(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, mode: McpFailure | None
    ) -> None:
        if mode is None:
            return await app(scope, receive, send)
        if mode == "tool_error":
            scope["state"] = {**scope.get("state", {}), "ctrlrun_tool_error": True}
            return await app(scope, receive, send)
        if isinstance(mode, int):
            return await _plain(send, mode, b"injected failure")
        if mode == "hang":
            await asyncio.sleep(self.hang_seconds)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            raise _Cut("hung, then cut")
        started: list[Message] = []

        async def keep(message: Message) -> None:
            started.append(message)

        await app(scope, receive, keep)  # the tool runs; its answer is kept back
        if mode == "commit_then_500":
            return await _plain(send, 500, b"Internal Server Error")
        head = next(m for m in started if m["type"] == "http.response.start")
        await send(head)
        raise _Cut("committed, then cut")

    # -- the REST request a tool makes ------------------------------------------------------

    def rest(self, ctx: Context[Any, Any, Any], method: str, path: str, **fields: Any) -> str:
        request = ctx.request_context.request
        headers = getattr(request, "headers", {})
        if getattr(getattr(request, "state", None), "ctrlrun_tool_error", False):
            raise ToolError("the fake was told to answer this tool call with an error")
        form = urlencode({k: v for k, v in fields.items() if v is not None}).encode()
        target = path if method != "GET" else f"{path}?{form.decode()}"
        rest = Request(
            method,
            target,
            "1.1",
            {
                "authorization": headers.get("authorization", ""),
                "content-type": "application/x-www-form-urlencoded",
                **{k: v for k, v in headers.items() if k.lower() == "stripe-account"},
            },
            b"" if method == "GET" else form,
        )
        refused = self.stripe.authorize(rest)
        response = refused or self.stripe.handle(rest)
        if response.status >= 400:
            raise ToolError(json.dumps(json.loads(response.body).get("error", {})))
        return response.body.decode()


def _add_tools(server: FastMCP, fake: FakeStripeMcp) -> None:
    """The tools, named and shaped as Stripe's MCP server's."""

    @server.tool()
    def create_refund(
        ctx: Context[Any, Any, Any],
        payment_intent: str,
        amount: int | None = None,
        reason: str | None = None,
    ) -> str:
        """Refund a payment intent (amount in minor units; all of it when omitted)."""
        return fake.rest(
            ctx, "POST", "/v1/refunds", payment_intent=payment_intent, amount=amount, reason=reason
        )

    @server.tool()
    def create_payout(ctx: Context[Any, Any, Any], amount: int, currency: str = "usd") -> str:
        """Pay out to the default external account."""
        return fake.rest(ctx, "POST", "/v1/payouts", amount=amount, currency=currency)

    @server.tool()
    def list_refunds(ctx: Context[Any, Any, Any], payment_intent: str | None = None) -> str:
        """List refunds, of one payment intent if given."""
        return fake.rest(ctx, "GET", "/v1/refunds", payment_intent=payment_intent)

    @server.tool()
    async def retrieve_balance(ctx: Context[Any, Any, Any]) -> str:
        """The account's balance; also says so on the session's GET stream."""
        await ctx.session.send_log_message("info", "balance retrieved")  # to the GET stream
        return json.dumps({"object": "balance", "available": [{"amount": 0, "currency": "usd"}]})


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes) -> Receive:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # as a client that sent all and waits
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _is_tool_call(body: bytes) -> bool:
    try:
        value = json.loads(body)
    except ValueError:
        return False
    items = value if isinstance(value, list) else [value]
    return any(isinstance(m, dict) and m.get("method") == "tools/call" for m in items)


async def _plain(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
