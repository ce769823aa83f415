"""The admin listener: ``/healthz``, ``/readyz`` and ``/metrics`` (loopback by default)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ctrlrun.store import StateStore

from .metrics import Metrics

log = logging.getLogger(__name__)
PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Admin:
    """A minimal HTTP/1.1 server: GET and HEAD only, one short answer per connection."""

    def __init__(self, store: Callable[[], StateStore], metrics: Metrics) -> None:
        self.store = store
        self.metrics = metrics

    async def start(self, host: str, port: int) -> asyncio.Server:
        return await asyncio.start_server(self._serve, host, port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            parts = line.decode("latin-1").split()
            method = parts[0] if parts else ""
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
            status, ctype, body = await self._answer(method, path)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            # HEAD: the headers GET would send (its Content-Length too), and no body.
            writer.write(head.encode("latin-1") + (b"" if method == "HEAD" else body))
            await writer.drain()
        except (TimeoutError, OSError, UnicodeDecodeError):
            pass
        finally:
            writer.close()

    async def _answer(self, method: str, path: str) -> tuple[str, str, bytes]:
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"GET only\n"
        if path == "/healthz":
            return "200 OK", "text/plain", b"ok\n"
        if path == "/readyz":
            try:
                await asyncio.wait_for(asyncio.to_thread(self.store().ping), 5)
            except Exception as exc:
                log.warning("not ready: %s", exc)
                return "503 Service Unavailable", "text/plain", b"ledger unreachable\n"
            return "200 OK", "text/plain", _ready(self.store())
        if path == "/metrics":
            body = await asyncio.to_thread(self.metrics.render, self.store())
            return "200 OK", PROMETHEUS_TYPE, body
        return "404 Not Found", "text/plain", b"try /healthz, /readyz or /metrics\n"


def _ready(store: StateStore) -> bytes:
    """``ready``, and a line when this host's clock is past its bound from the ledger's.

    A skewed clock leaves the sidecar ready: no decision reads this host's clock when the
    ledger has its own (``ctrlrun.clocks``); the line and the metric tell the operator.
    """
    skew = store.skew
    if skew is None or not skew.beyond:
        return b"ready\n"
    line = f"ready\nclock: {skew.describe()} (bound {skew.bound:.1f} s)\n"
    return line.encode("ascii")
