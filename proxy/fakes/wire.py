"""A minimal HTTP/1.1 request reader and response writer for the fake remotes.

Only what the fakes need: a request line, headers, a ``Content-Length`` or chunked body,
keep-alive; responses with a fixed body or a chunked stream (Kubernetes watches).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class BadRequest(Exception):
    """The bytes on the connection are not an HTTP/1.1 request the fakes understand."""


@dataclass(frozen=True)
class Request:
    """One parsed request; header names are lower case."""

    method: str
    target: str
    version: str
    headers: Mapping[str, str]
    body: bytes

    @property
    def path(self) -> str:
        return unquote(urlsplit(self.target).path) or "/"

    @property
    def query(self) -> list[tuple[str, str]]:
        return parse_qsl(urlsplit(self.target).query, keep_blank_values=True)

    @property
    def is_write(self) -> bool:
        return self.method in WRITE_METHODS

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)

    @property
    def keep_alive(self) -> bool:
        conn = self.header("connection").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in conn
        return "close" not in conn


@dataclass
class Response:
    """A response: a fixed ``body``, or a chunked ``stream`` of byte strings."""

    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    stream: AsyncIterator[bytes] | None = None

    @classmethod
    def json(cls, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> Response:
        body = json.dumps(payload, separators=(",", ":")).encode()
        hdrs = {"Content-Type": "application/json"}
        hdrs.update(headers or {})
        return cls(status, body, hdrs)

    def payload(self) -> Any:
        """The JSON body decoded (for tests and for the fakes' own bookkeeping)."""
        return json.loads(self.body) if self.body else None

    def head(self, keep_alive: bool) -> bytes:
        try:
            reason = HTTPStatus(self.status).phrase
        except ValueError:
            reason = "Unknown"
        lines = [f"HTTP/1.1 {self.status} {reason}"]
        lines += [f"{k}: {v}" for k, v in self.headers.items()]
        if self.stream is None:
            lines.append(f"Content-Length: {len(self.body)}")
        else:
            lines.append("Transfer-Encoding: chunked")
        if not keep_alive:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> Request | None:
    """Read one request; ``None`` when the peer closed the connection between requests."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise BadRequest("connection closed inside the request head") from exc
        return None
    except asyncio.LimitOverrunError as exc:
        raise BadRequest("request head too large") from exc
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest("bad request line")
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest("bad header line")
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    body = await _read_body(reader, headers)
    return Request(method.upper(), target, version, headers, body)


async def _read_body(reader: asyncio.StreamReader, headers: Mapping[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks: list[bytes] = []
        total = 0
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError as exc:
                raise BadRequest("bad chunk size") from exc
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailers are read and ignored
                return b"".join(chunks)
            total += size
            if total > MAX_BODY_BYTES:
                raise BadRequest("body too large")
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
    length_text = headers.get("content-length", "0") or "0"
    try:
        length = int(length_text)
    except ValueError as exc:
        raise BadRequest("bad Content-Length") from exc
    if length < 0 or length > MAX_BODY_BYTES:
        raise BadRequest("bad Content-Length")
    return await reader.readexactly(length) if length else b""


async def write_response(
    writer: asyncio.StreamWriter, response: Response, *, keep_alive: bool, head_only: bool = False
) -> None:
    """Write ``response``; a stream is sent chunked and ends the exchange when exhausted."""
    writer.write(response.head(keep_alive))
    if head_only:
        await writer.drain()
        return
    if response.stream is None:
        writer.write(response.body)
        await writer.drain()
        return
    async for chunk in response.stream:
        if chunk:
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


def reset(writer: asyncio.StreamWriter) -> None:
    """Abort the connection with a TCP RST (SO_LINGER 0) instead of an orderly FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
