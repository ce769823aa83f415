"""A small HTTP/1.1 client over asyncio streams that knows exactly how far a request got.

One :class:`Pool` per upstream keeps idle keep-alive connections. A request either returns a
:class:`Response` (the status line arrived; ``error`` is set when the body was then cut), or
raises :class:`RequestFailed`, whose ``transport`` says whether anything may have been sent::

    bad request line or header, pool wait, DNS, refused,
      connect timeout, TLS handshake (a new connection)       NOT_SENT
    any error once the first request byte is handed to the
      transport, or any error on a reused connection          SENT_NO_STATUS
    an error after the status line                             Response(status, error=...)

A reused keep-alive connection the server closed while idle is dropped before use when its
EOF is already seen; when the close crosses our write on the wire, nobody can tell it from a
server that got the request, so it is SENT_NO_STATUS (never NOT_SENT).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

from .classify import Transport

# Headers that belong to one hop, never forwarded (host and length are set by the client).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
# Control bytes but HTAB, CR and LF (those are counted where the head is put together).
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
MAX_LINE = 64 * 1024
MAX_HEADERS = 200
NO_BODY_STATUSES = frozenset({204, 304})
_CHUNK = 64 * 1024


class ProtocolError(Exception):
    """The remote's bytes are not the HTTP/1.1 this client reads."""


class Closed(ProtocolError):
    """The remote closed the connection before the message was complete; says how far it got."""


class RequestFailed(Exception):
    """No status line came back; ``transport`` says whether the request may have been sent."""

    def __init__(self, transport: Transport, cause: BaseException | str) -> None:
        self.transport = transport
        self.line = cause if isinstance(cause, str) else _line(cause)
        super().__init__(self.line)


@dataclass(frozen=True)
class Response:
    """A final status, its headers and body; ``error`` says why the body was cut short."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    error: str | None = None


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    loop: asyncio.AbstractEventLoop
    idle_since: float = 0.0

    def usable(self, loop: asyncio.AbstractEventLoop, expiry: float) -> bool:
        # An EOF (or stray bytes) already seen means the server gave up on it while idle.
        return (
            loop is self.loop
            and not self.writer.is_closing()
            and not self.reader.at_eof()
            and not getattr(self.reader, "_buffer", b"")  # stray bytes: never reuse
            and loop.time() - self.idle_since < expiry
        )

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # its loop is already closed
            self.writer.transport.abort()


class Pool:
    """Keep-alive HTTP/1.1 connections to one origin, at most ``max_connections`` in use."""

    def __init__(
        self,
        scheme: str,
        host: str,
        port: int,
        *,
        timeout: float,
        connect_timeout: float | None = None,
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int = 100,
        max_idle: int = 20,
        keepalive_expiry: float = 5.0,
        max_body: int = 16 * 1024 * 1024,
    ) -> None:
        if scheme not in ("http", "https"):
            raise ValueError(f"unsupported scheme {scheme!r}")
        self.host, self.port, self.timeout = host, port, timeout
        self.connect_timeout = timeout if connect_timeout is None else connect_timeout
        self._ssl = (ssl_context or ssl.create_default_context()) if scheme == "https" else None
        name = f"[{host}]" if ":" in host else host
        default = 443 if scheme == "https" else 80
        self.host_header = name if port == default else f"{name}:{port}"
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Conn] = []
        self._max_idle, self._expiry, self._max_body = max_idle, keepalive_expiry, max_body
        self._closed = False

    async def request(
        self, method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes
    ) -> Response:
        """Send one request and read its answer, all within the pool's ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        try:
            data = self._serialise(method, target, headers, body)
        except (ValueError, UnicodeError) as exc:
            raise RequestFailed(Transport.NOT_SENT, exc) from exc
        try:
            async with asyncio.timeout_at(deadline):
                await self._slots.acquire()
        except TimeoutError as exc:
            raise RequestFailed(
                Transport.NOT_SENT, "PoolTimeout: no free connection in time"
            ) from exc
        try:
            return await self._exchange(loop, deadline, method, data)
        finally:
            self._slots.release()

    async def aclose(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()

    async def _exchange(
        self, loop: asyncio.AbstractEventLoop, deadline: float, method: str, data: bytes
    ) -> Response:
        conn = self._take_idle(loop)
        reused = conn is not None
        if conn is None:
            try:
                async with asyncio.timeout_at(min(deadline, loop.time() + self.connect_timeout)):
                    reader, writer = await asyncio.open_connection(
                        self.host,
                        self.port,
                        ssl=self._ssl,
                        server_hostname=self.host if self._ssl else None,
                        limit=MAX_LINE,
                    )
            except (OSError, TimeoutError) as exc:  # gaierror, refused, SSLError: all OSError
                # Records keep the word ConnectError (as with httpx) and name the cause.
                what = f"ConnectError: {_line(exc, 'no connection in time')}"
                raise RequestFailed(Transport.NOT_SENT, what) from exc
            conn = _Conn(reader, writer, loop)
        keep = False
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    conn.writer.write(data)  # from here on, the remote may have it
                    await conn.writer.drain()
                    status, http10 = await _read_status(conn.reader)
            except (OSError, TimeoutError, EOFError, ProtocolError, ValueError) as exc:
                what = _line(exc, "no status line in time")
                what = f"reused connection: {what}" if reused else what
                raise RequestFailed(Transport.SENT_NO_STATUS, what) from exc
            head: list[tuple[str, str]] = []
            try:
                async with asyncio.timeout_at(deadline):
                    await _read_headers(conn.reader, head)
                    body, delimited = await self._read_body(conn.reader, method, status, head)
            except (OSError, TimeoutError, EOFError, ProtocolError, ValueError) as exc:
                return Response(status, tuple(head), b"", error=_line(exc, "body not read in time"))
            closes = any(k.lower() == "connection" and "close" in v.lower() for k, v in head)
            keep = delimited and not closes and not http10 and status != 101
            if any(k.lower() == "transfer-encoding" for k, _ in head) and delimited:
                head = [(k, v) for k, v in head if k.lower() != "transfer-encoding"]
            return Response(status, tuple(head), body)
        finally:
            if keep and not self._closed and len(self._idle) < self._max_idle:
                conn.idle_since = loop.time()
                self._idle.append(conn)
            else:
                conn.close()

    def _take_idle(self, loop: asyncio.AbstractEventLoop) -> _Conn | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable(loop, self._expiry):
                return conn
            conn.close()
        return None

    def _serialise(
        self, method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes
    ) -> bytes:
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.host_header}"]
        lines += [f"{k}: {v}" for k, v in headers if k.lower() not in HOP_BY_HOP]
        if body or method.upper() in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body)}")
        text = "\r\n".join(lines)
        breaks = len(lines) - 1  # only the ones joining the lines
        if text.count("\r") != breaks or text.count("\n") != breaks or " " in target + method:
            raise ValueError("a line break or space inside the request line or a header")
        # A request that came in over HTTP/2 may hold bytes HTTP/1.1 forbids (the h2 library
        # refuses line breaks, not tabs or other control bytes): none goes out in the request
        # line, where a server may split at a tab, nor in a header, where one may cut it short;
        # nor a header name that is not a token ("a:b: c" would be "a").
        if _CONTROL.search(text) or "\t" in method + target:
            raise ValueError("a control character inside the request line or a header")
        if not all(_TOKEN.fullmatch(name) for name, _ in headers):
            raise ValueError("a header name that is not an HTTP token")
        return text.encode("utf-8", "surrogateescape") + b"\r\n\r\n" + body

    async def _read_body(
        self,
        reader: asyncio.StreamReader,
        method: str,
        status: int,
        head: list[tuple[str, str]],
    ) -> tuple[bytes, bool]:
        """The body and whether its end was delimited (so the connection may be reused)."""
        if method.upper() == "HEAD" or status in NO_BODY_STATUSES or status == 101:
            return b"", True
        codings = [v.strip().lower() for k, v in head if k.lower() == "transfer-encoding"]
        if codings:
            if ",".join(codings).split(",")[-1].strip() != "chunked":
                return await self._read_to_eof(reader), False
            return await self._read_chunked(reader), True
        lengths = {v.strip() for k, v in head if k.lower() == "content-length"}
        if lengths:
            if len(lengths) > 1 or not next(iter(lengths)).isdigit():
                raise ProtocolError(f"bad Content-Length {sorted(lengths)}")
            size = int(next(iter(lengths)))
            if size > self._max_body:
                raise ProtocolError("response larger than the proxy keeps in memory")
            return await _exactly(reader, size, "body bytes"), True
        return await self._read_to_eof(reader), False

    async def _read_chunked(self, reader: asyncio.StreamReader) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            line = await _readline(reader, "the chunked body")
            n = int(line.split(b";", 1)[0].strip() or b"x", 16)
            if n < 0:
                raise ProtocolError("negative chunk size")
            if n == 0:
                await _read_headers(reader, [])  # trailers, discarded
                return b"".join(chunks)
            size += n
            if size > self._max_body:
                raise ProtocolError("response larger than the proxy keeps in memory")
            chunks.append(await _exactly(reader, n, "bytes of a chunk"))
            if await _exactly(reader, 2, "bytes of a chunk's end") != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")

    async def _read_to_eof(self, reader: asyncio.StreamReader) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while chunk := await reader.read(_CHUNK):
            size += len(chunk)
            if size > self._max_body:
                raise ProtocolError("response larger than the proxy keeps in memory")
            chunks.append(chunk)
        return b"".join(chunks)


async def _exactly(reader: asyncio.StreamReader, size: int, what: str) -> bytes:
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        raise Closed(f"the connection closed after {len(exc.partial)} of {size} {what}") from exc


async def _readline(reader: asyncio.StreamReader, where: str = "the response headers") -> bytes:
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError as exc:
        raise ProtocolError("line too long") from exc
    except asyncio.IncompleteReadError as exc:
        if not exc.partial and where == "the status line":
            raise Closed("the connection closed before a status line arrived") from exc
        raise Closed(f"the connection closed inside {where}") from exc
    return line.rstrip(b"\r\n")


async def _read_status(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """The final status (1xx informational answers skipped) and whether it is HTTP/1.0."""
    while True:
        line = await _readline(reader, "the status line")
        parts = line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3:
            raise ProtocolError(f"not a status line: {line[:40]!r}")
        status = int(parts[1])
        if status < 100:
            raise ProtocolError(f"not a status: {status}")
        if status >= 200 or status == 101:
            return status, parts[0] == b"HTTP/1.0"
        await _read_headers(reader, [])


async def _read_headers(reader: asyncio.StreamReader, into: list[tuple[str, str]]) -> None:
    for _ in range(MAX_HEADERS):
        line = await _readline(reader)
        if not line:
            return
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise ProtocolError(f"bad header line: {line[:40]!r}")
        into.append((name.decode("latin-1"), value.strip().decode("latin-1")))
    raise ProtocolError("too many headers")


def _line(exc: BaseException, default: str = "no detail") -> str:
    if isinstance(exc, Closed):
        return str(exc)  # already a line for people: how far the message got
    text = " ".join(str(exc).split()) or default
    return f"{type(exc).__name__}: {text}"[:300]
