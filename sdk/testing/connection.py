"""One HTTP/1.1 connection of a fake remote, framed by h11: requests in, answers out.

The fake decides every answer. Besides a :class:`Response` it may end the connection instead
of answering: :attr:`Abort.DROP` closes it before any response byte (a reply lost after the
remote acted), :attr:`Abort.RESET` aborts it with a TCP RST.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import socket
import struct
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import TypeAlias

import h11

from .messages import Request, Response

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024
_READ_SIZE = 64 * 1024


class Abort(enum.Enum):
    """How a fake ends a connection instead of answering the request on it."""

    DROP = "drop"
    RESET = "reset"


Answer: TypeAlias = Response | Abort
Responder: TypeAlias = Callable[[Request], Awaitable[Answer]]


class BadRequest(Exception):
    """The peer sent something that is not an HTTP/1.1 request: answered ``status``, closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def serve(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, respond: Responder
) -> None:
    """Answer requests on one connection until either side ends it (the caller closes it)."""
    conn = _Connection(reader, writer)
    while True:
        try:
            request = await conn.next_request()
        except BadRequest as exc:
            await conn.refuse(exc.status, str(exc))
            return
        if request is None:
            return
        answer = await respond(request)
        if answer is Abort.RESET:
            reset(writer)
        if isinstance(answer, Abort):
            return
        if answer.upgrade is not None:
            await conn.switch(answer)
            return  # the connection is the upgrade's now, and ends with it
        await conn.send(answer, head_only=request.method == "HEAD")
        if not conn.next_cycle():
            return


def reset(writer: asyncio.StreamWriter) -> None:
    """Abort the connection with a TCP RST (SO_LINGER 0) instead of an orderly FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Connection:
    """An h11 server connection over an asyncio stream pair."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)

    async def next_request(self) -> Request | None:
        """The next whole request; ``None`` when the peer closed between requests."""
        head = await self._next_event()
        if isinstance(head, h11.ConnectionClosed):
            return None
        if not isinstance(head, h11.Request):
            raise BadRequest(400, "expected a request")
        if _declared_length(head) > MAX_BODY_BYTES:
            raise BadRequest(413, "request body too large")
        if self._h11.they_are_waiting_for_100_continue:
            self._write(h11.InformationalResponse(status_code=100, headers=[]))
        body = bytearray()
        while not isinstance(event := await self._next_event(), h11.EndOfMessage):
            if not isinstance(event, h11.Data):
                raise BadRequest(400, "incomplete request body")
            body += event.data
            if len(body) > MAX_BODY_BYTES:
                raise BadRequest(413, "request body too large")
        return _request(head, bytes(body))

    async def send(self, response: Response, *, head_only: bool) -> None:
        """Send ``response``; a stream goes chunked and ends the connection when exhausted."""
        headers = list(response.headers.items())
        if response.stream is None:
            headers.append(("Content-Length", str(len(response.body))))
        else:
            headers.append(("Connection", "close"))
        self._write(
            h11.Response(status_code=response.status, headers=headers, reason=_reason(response))
        )
        if head_only:
            pass
        elif response.stream is None:
            if response.body:
                self._write(h11.Data(data=response.body))
        else:
            async for chunk in response.stream:
                if chunk:
                    self._write(h11.Data(data=chunk))
                    await self._writer.drain()
        self._write(h11.EndOfMessage())
        await self._writer.drain()

    async def switch(self, response: Response) -> None:
        """Answer 101 and hand the connection (and bytes already read) to ``response.upgrade``."""
        assert response.upgrade is not None
        head = h11.InformationalResponse(
            status_code=101, headers=list(response.headers.items()), reason=b"Switching Protocols"
        )
        self._write(head)
        await self._writer.drain()
        early, _ = self._h11.trailing_data
        await response.upgrade(self._reader, self._writer, early)

    async def refuse(self, status: int, message: str) -> None:
        """Answer bytes that are not a request, when the exchange still allows an answer."""
        if self._h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        refusal = Response.text(status, message)
        refusal.headers["Connection"] = "close"
        with contextlib.suppress(h11.LocalProtocolError):
            await self.send(refusal, head_only=False)

    def next_cycle(self) -> bool:
        """Get ready for the next request on this connection; False when it must close."""
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()
            return True
        return False

    async def _next_event(self) -> h11.Event | type[h11.PAUSED]:
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise BadRequest(exc.error_status_hint, str(exc)) from exc
            if event is h11.NEED_DATA:
                self._h11.receive_data(await self._reader.read(_READ_SIZE))
            elif event is h11.PAUSED or isinstance(event, h11.Event):
                return event

    def _write(self, event: h11.Event) -> None:
        data = self._h11.send(event)
        if data:
            self._writer.write(data)


def _request(head: h11.Request, body: bytes) -> Request:
    headers: dict[str, str] = {}
    for raw_name, raw_value in head.headers:
        name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return Request(
        method=head.method.decode("ascii").upper(),
        target=head.target.decode("latin-1"),
        version=f"HTTP/{head.http_version.decode('ascii')}",
        headers=headers,
        body=body,
    )


def _declared_length(head: h11.Request) -> int:
    """The Content-Length of ``head`` (h11 has checked it is one valid number), else 0."""
    return next((int(value) for name, value in head.headers if name == b"content-length"), 0)


def _reason(response: Response) -> bytes:
    try:
        return HTTPStatus(response.status).phrase.encode("ascii")
    except ValueError:
        return b"Unknown"
