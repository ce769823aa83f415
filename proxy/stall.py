"""Closing connections whose requests stall: a slowloris holds no socket for long.

mitmproxy closes a connection only after ten idle minutes, and a client that sends one byte
a minute is never idle. This addon gives each client connection a deadline:

    connected, or its last answer sent    the next request head within request_head_timeout
    a request head arrived                its body within request_body_timeout

and closes the connection when the deadline passes first. A connection that became a tunnel
(CONNECT) or carries an answer still being streamed has no head deadline until its next answer
ends; a tunnel the proxy does not intercept is left to mitmproxy's own idle timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from mitmproxy import connection, http

from .limits import Limits

log = logging.getLogger(__name__)


class StallGuard:
    """Head and body deadlines for every client connection."""

    def __init__(self, limits: Callable[[], Limits], connections: Callable[[], Any]) -> None:
        self.limits = limits
        self.connections = connections  # client id -> mitmproxy's connection handler
        self.timers: dict[str, asyncio.TimerHandle] = {}
        self.open: dict[str, int] = {}  # client id -> requests without their answer yet

    def client_connected(self, client: connection.Client) -> None:
        self._arm(client, self.limits().request_head_timeout, "request head")

    def client_disconnected(self, client: connection.Client) -> None:
        self._disarm(client.id)
        self.open.pop(client.id, None)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        client = flow.client_conn
        self.open[client.id] = self.open.get(client.id, 0) + 1
        self._arm(client, self.limits().request_body_timeout, "request body")

    def request(self, flow: http.HTTPFlow) -> None:
        self._disarm(flow.client_conn.id)

    def http_connect(self, flow: http.HTTPFlow) -> None:
        self._done(flow)  # the head was the CONNECT; what follows is the tunnel's

    def response(self, flow: http.HTTPFlow) -> None:
        self._done(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._done(flow)

    def _done(self, flow: http.HTTPFlow) -> None:
        client = flow.client_conn
        left = max(self.open.get(client.id, 1) - 1, 0)
        self.open[client.id] = left
        if flow.request.method.upper() == "CONNECT":
            self._disarm(client.id)
        elif left == 0 and client.state is not connection.ConnectionState.CLOSED:
            self._arm(client, self.limits().request_head_timeout, "request head")

    def _arm(self, client: connection.Client, seconds: float, what: str) -> None:
        self._disarm(client.id)
        loop = asyncio.get_running_loop()
        self.timers[client.id] = loop.call_later(seconds, self._expire, client, what, seconds)

    def _disarm(self, client_id: str) -> None:
        timer = self.timers.pop(client_id, None)
        if timer is not None:
            timer.cancel()

    def _expire(self, client: connection.Client, what: str, seconds: float) -> None:
        self.timers.pop(client.id, None)
        handler = self.connections().get(client.id)
        if handler is None:
            return
        log.info("closing %s: no complete %s within %gs", client.peername, what, seconds)
        with contextlib.suppress(KeyError, AttributeError):
            handler.transports[handler.client].handler.cancel("stalled")
