"""The request a fake remote handles and the response it gives (values; the wire is h11's)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias
from urllib.parse import parse_qsl, unquote, urlsplit

if TYPE_CHECKING:
    import asyncio

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# What serves a connection once it switched protocols: its reader, writer and the bytes the
# peer sent after its request (already read off the socket).
Upgrade: TypeAlias = Callable[
    ["asyncio.StreamReader", "asyncio.StreamWriter", bytes], Awaitable[None]
]


@dataclass(frozen=True)
class Request:
    """One received request; header names are lower case, repeated headers joined by ', '."""

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


@dataclass
class Response:
    """A response: a fixed ``body``, a chunked ``stream`` of byte strings, or (status 101)
    an ``upgrade`` that takes the connection over."""

    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    stream: AsyncIterator[bytes] | None = None
    upgrade: Upgrade | None = None

    @classmethod
    def json(cls, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> Response:
        body = json.dumps(payload, separators=(",", ":")).encode()
        hdrs = {"Content-Type": "application/json"}
        hdrs.update(headers or {})
        return cls(status, body, hdrs)

    @classmethod
    def text(cls, status: int, message: str) -> Response:
        return cls(status, f"{message}\n".encode(), {"Content-Type": "text/plain"})

    def payload(self) -> Any:
        """The JSON body decoded (for tests and for the fakes' own bookkeeping)."""
        return json.loads(self.body) if self.body else None
