"""A TCP listener served by its own event loop in a daemon thread, so tests stay synchronous.

``stop`` closes the listener and cancels every open connection (hung ones included), so a
fake can be stopped and started again on the same port within one test.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

log = logging.getLogger(__name__)
Handler: TypeAlias = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
START_SECONDS = 15.0


class Listener:
    """Accepts connections on ``host:port`` and runs ``handler`` for each, on a loop thread."""

    def __init__(self, name: str, handler: Handler) -> None:
        self._name = name
        self._handler = handler
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Future[None] | None = None
        self._conns: set[asyncio.Task[Any]] = set()
        self._port = 0
        self._start_error: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self, host: str, port: int, tls: ssl.SSLContext | None) -> int:
        """Listen and serve in a background thread; the port bound (``port`` 0: any free one)."""
        if self._thread is not None:
            raise RuntimeError(f"{self._name} is already running")
        ready = threading.Event()
        self._start_error = None
        self._thread = threading.Thread(
            target=self._run, args=(ready, host, port, tls), name=self._name, daemon=True
        )
        self._thread.start()
        if not ready.wait(START_SECONDS) or self._start_error is not None:
            self.stop()
            raise RuntimeError(f"{self._name} did not start") from self._start_error
        return self._port

    def stop(self) -> None:
        """Close the listener and every open connection; wait for the thread to end."""
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None:
            return
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(_settle, stop)
        thread.join(START_SECONDS)
        self._thread = None

    def _run(
        self, ready: threading.Event, host: str, port: int, tls: ssl.SSLContext | None
    ) -> None:
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(lambda _loop, ctx: log.debug("%s", ctx.get("message")))
        self._loop = loop
        try:
            loop.run_until_complete(self._main(ready, host, port, tls))
        finally:
            loop.close()
            ready.set()

    async def _main(
        self, ready: threading.Event, host: str, port: int, tls: ssl.SSLContext | None
    ) -> None:
        self._stop = asyncio.get_running_loop().create_future()
        try:
            server = await asyncio.start_server(
                self._connection, host, port, ssl=tls, backlog=1024, reuse_address=True
            )
        except OSError as exc:
            self._start_error = exc
            return
        self._port = int(server.sockets[0].getsockname()[1])
        ready.set()
        await self._stop
        server.close()
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        await server.wait_closed()
        await asyncio.sleep(0)  # let the transports' connection_lost callbacks run

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._conns.add(task)
        try:
            await self._handler(reader, writer)
        except OSError:  # incl. SSLError and resets: the client went away, nothing to answer
            pass
        except asyncio.CancelledError:
            pass  # the listener is stopping
        except Exception:
            log.exception("%s: connection failed", self._name)
        finally:
            if task is not None:
                self._conns.discard(task)
            await _close(writer)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close and wait (briefly: a TLS peer may never answer close_notify), else abort."""
    try:
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), 0.5)
    except (Exception, asyncio.CancelledError):
        writer.transport.abort()
