"""The HTTP server shared by the fake remotes: a loop in a thread, counting, failure injection.

A fake subclasses :class:`FakeServer` and implements ``handle`` (apply one request and answer
it) and ``error_response`` (the remote's own error shape for a status). Handlers run on the
server's event loop thread; remote state is guarded by ``self._lock`` because tests read and
seed it from their own thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from .failures import MAX_HANG_SECONDS, Failures, ReadMode, WriteMode
from .wire import (
    MAX_HEADER_BYTES,
    BadRequest,
    Request,
    Response,
    read_request,
    reset,
    write_response,
)

if TYPE_CHECKING:
    from .tlsca import FakeCA

log = logging.getLogger(__name__)
READ_METHODS = frozenset({"GET", "HEAD"})
_R = TypeVar("_R")


class FakeServer:
    """A real HTTP/1.1 server on loopback, run by its own event loop in a background thread."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        tls: bool = False,
        hang_seconds: float = 30.0,
    ) -> None:
        self.host = host
        self.tls = tls
        self.hang_seconds = hang_seconds
        self._port = port
        self._lock = threading.RLock()
        self._requests: list[tuple[str, str]] = []
        self._writes_applied = 0
        self._failures = Failures()
        self._ca: FakeCA | None = None
        if tls:  # lazily: cryptography is only needed for TLS
            from .tlsca import fake_ca

            self._ca = fake_ca()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Future[None] | None = None
        self._conns: set[asyncio.Task[Any]] = set()
        self._start_error: BaseException | None = None

    # -- what a fake implements -------------------------------------------------------------

    def handle(self, request: Request) -> Response:
        """Apply ``request`` to the remote's state and answer it."""
        raise NotImplementedError

    def error_response(
        self, request: Request, status: int, *, applied: Response | None
    ) -> Response:
        """Answer ``status`` in the remote's error shape (``applied``: the write did happen)."""
        raise NotImplementedError

    def authorize(self, request: Request) -> Response | None:
        """A refusal when the request's credentials are not acceptable (checked first)."""
        return None

    def finalize(self, request: Request, response: Response) -> Response:
        """Last touch on every answer (e.g. a request id header)."""
        return response

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def hang_seconds(self) -> float:
        return self._hang_seconds

    @hang_seconds.setter
    def hang_seconds(self, seconds: float) -> None:
        if not 0 <= seconds <= MAX_HANG_SECONDS:
            raise ValueError(f"hang_seconds must be within 0..{MAX_HANG_SECONDS:g}")
        self._hang_seconds = float(seconds)

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self._port}"

    @property
    def ca_file(self) -> str | None:
        """Path of the PEM of the CA that signed the server certificate (TLS mode only)."""
        return str(self._ca.ca_file) if self._ca else None

    def start(self) -> Self:
        """Listen and serve in a background thread; a stopped fake may be started again."""
        if self._thread is not None:
            raise RuntimeError(f"{type(self).__name__} is already running")
        ready = threading.Event()
        self._start_error = None
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name=type(self).__name__, daemon=True
        )
        self._thread.start()
        if not ready.wait(15) or self._start_error is not None:
            self.stop()
            raise RuntimeError(f"{type(self).__name__} did not start") from self._start_error
        return self

    def stop(self) -> None:
        """Close the listener and every open connection (hung ones included); wait for it."""
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None:
            return
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(_settle, stop)
        thread.join(15)
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- counters and failure injection -------------------------------------------------------

    @property
    def requests(self) -> list[tuple[str, str]]:
        """Every request received, in order, as ``(method, path)`` (path without query)."""
        with self._lock:
            return list(self._requests)

    def count(self, method: str | None = None, path: str | None = None) -> int:
        """How many requests matched ``method`` and started with ``path``."""
        with self._lock:
            return sum(
                1
                for m, p in self._requests
                if (method is None or m == method.upper()) and (path is None or p.startswith(path))
            )

    @property
    def writes_applied(self) -> int:
        """State-changing requests that were actually applied (replays and errors excluded)."""
        with self._lock:
            return self._writes_applied

    def reset_counts(self) -> None:
        with self._lock:
            self._requests.clear()
            self._writes_applied = 0

    def fail_next(self, mode: WriteMode | None, times: int = 1, *, path: str | None = None) -> None:
        """Make the next ``times`` writes (under ``path``) fail with ``mode``; None clears."""
        self._failures.fail_next(mode, times, path=path)

    def fail_reads(
        self, mode: ReadMode | None, times: int | None = None, *, path: str | None = None
    ) -> None:
        """Make GETs (under ``path``) fail with ``mode``, ``times`` or until cleared with None."""
        self._failures.fail_reads(mode, times, path=path)

    def delay_next(self, seconds: float) -> None:
        """Hold the next write ``seconds`` before applying and answering it."""
        self._failures.delay_next(seconds)

    def _applied(self) -> None:
        with self._lock:
            self._writes_applied += 1

    # -- the server -------------------------------------------------------------------------

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(lambda _loop, ctx: log.debug("%s", ctx.get("message")))
        self._loop = loop
        try:
            loop.run_until_complete(self._main(ready))
        finally:
            loop.close()
            ready.set()

    async def _main(self, ready: threading.Event) -> None:
        self._stop = asyncio.get_running_loop().create_future()
        try:
            server = await asyncio.start_server(
                self._connection,
                self.host,
                self._port,
                ssl=self._ca.server_context() if self._ca else None,
                limit=MAX_HEADER_BYTES,
                backlog=1024,
                reuse_address=True,
            )
        except OSError as exc:
            self._start_error = exc
            return
        self._port = server.sockets[0].getsockname()[1]
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
            while True:
                try:
                    request = await read_request(reader, writer)
                except BadRequest as exc:
                    bad = Response(400, f"{exc}\n".encode(), {"Content-Type": "text/plain"})
                    await write_response(writer, bad, keep_alive=False)
                    break
                if request is None:
                    break
                with self._lock:
                    self._requests.append((request.method, request.path))
                if not await self._exchange(request, writer):
                    break
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):  # incl. SSLError
            pass  # the client went away; nothing to answer
        except asyncio.CancelledError:
            pass  # the server is stopping
        finally:
            if task is not None:
                self._conns.discard(task)
            await _close(writer)

    async def _exchange(self, request: Request, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection must not be reused."""
        response = self._call(request, self.authorize)
        if response is None and request.is_write:
            mode = self._failures.take_write(request.path)
            if mode == "reset_before":
                reset(writer)
                return False
            if mode == "hang":
                await asyncio.sleep(self._hang_seconds)
                return False
            if mode == "commit_then_drop":  # applied, then closed before any response byte
                self._call(request, self.handle)
                return False
            if mode == "commit_then_500":
                applied = self._call(request, self.handle)
                response = self.error_response(request, 500, applied=applied)
            elif isinstance(mode, int):
                response = self.error_response(request, mode, applied=None)
            elif delay := self._failures.take_delay():
                await asyncio.sleep(delay)
        elif response is None and request.method in READ_METHODS:
            read_mode = self._failures.take_read(request.path)
            if read_mode == "drop":
                return False
            if read_mode == "hang":
                await asyncio.sleep(self._hang_seconds)
                return False
            if isinstance(read_mode, int):
                response = self.error_response(request, read_mode, applied=None)
        if response is None:
            response = self._call(request, self.handle)
        response = self.finalize(request, response)
        keep_alive = request.keep_alive and response.stream is None
        head_only = request.method == "HEAD"
        await write_response(writer, response, keep_alive=keep_alive, head_only=head_only)
        return keep_alive

    def _call(self, request: Request, handler: Callable[[Request], _R]) -> _R | Response:
        """Run a fake's hook; a bug in it answers 500 instead of killing the connection."""
        try:
            return handler(request)
        except Exception:
            log.exception(
                "%s: handler failed for %s %s", type(self).__name__, request.method, request.path
            )
            return self.error_response(request, 500, applied=None)


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
