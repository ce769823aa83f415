"""The base of the fake remotes: a real HTTP/1.1 server on loopback, with counts and failures.

A fake subclasses :class:`FakeServer` and implements ``handle`` (apply one request and answer
it) and ``error_response`` (the remote's own error shape for a status). Handlers run on the
server's event loop thread; remote state is guarded by ``self._lock`` because tests read and
seed it from their own thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Self, TypeVar

from ctrlrun.errors import MissingDependency

from .connection import Abort, Answer, serve
from .failures import MAX_HANG_SECONDS, Failures, ReadMode, WriteMode
from .listener import Listener
from .messages import Request, Response

if TYPE_CHECKING:
    from .tls import FakeCA

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
        self._dry_runs: list[tuple[str, str]] = []
        self._writes_applied = 0
        self._failures = Failures()
        self._ca: FakeCA | None = None
        if tls:
            self._ca = _test_ca()
        self._listener = Listener(type(self).__name__, partial(serve, respond=self._answer))

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
        context = self._ca.server_context(self.host) if self._ca else None
        self._port = self._listener.start(self.host, self._port, context)
        return self

    def stop(self) -> None:
        """Close the listener and every open connection (hung ones included); wait for it."""
        self._listener.stop()

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
            self._dry_runs.clear()
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

    # -- one exchange (server thread) ---------------------------------------------------------

    @property
    def dry_runs(self) -> list[tuple[str, str]]:
        """Writes that persisted nothing (``persists_nothing``), as ``(method, path)``."""
        with self._lock:
            return list(self._dry_runs)

    def persists_nothing(self, request: Request) -> bool:
        """Whether the remote stores nothing for ``request`` (a server-side dry run).

        Such a request is listed in ``dry_runs``, not ``requests``, and suffers no armed
        write failure: the counts and the failures are about writes that can change state.
        """
        return False

    async def _answer(self, request: Request) -> Answer:
        """Count ``request``, suffer any armed failure, else let the fake answer it."""
        if request.is_write and self.persists_nothing(request):
            with self._lock:
                self._dry_runs.append((request.method, request.path))
            refused = self._call(request, self.authorize)
            answered = self._call(request, self.handle) if refused is None else refused
            return self.finalize(request, answered)
        with self._lock:
            self._requests.append((request.method, request.path))
        injected: Answer | None = self._call(request, self.authorize)
        if injected is None and request.is_write:
            injected = await self._inject_write(request)
        elif injected is None and request.method in READ_METHODS:
            injected = await self._inject_read(request)
        if isinstance(injected, Abort):
            return injected
        response = injected if injected is not None else self._call(request, self.handle)
        return self.finalize(request, response)

    async def _inject_write(self, request: Request) -> Answer | None:
        mode = self._failures.take_write(request.path)
        if mode == "reset_before":
            return Abort.RESET
        if mode == "hang":
            await asyncio.sleep(self._hang_seconds)
            return Abort.DROP
        if mode == "commit_then_drop":  # applied, then closed before any response byte
            self._call(request, self.handle)
            return Abort.DROP
        if mode == "commit_then_500":
            applied = self._call(request, self.handle)
            return self.error_response(request, 500, applied=applied)
        if isinstance(mode, int):
            return self.error_response(request, mode, applied=None)
        if delay := self._failures.take_delay():
            await asyncio.sleep(delay)
        return None

    async def _inject_read(self, request: Request) -> Answer | None:
        mode = self._failures.take_read(request.path)
        if mode == "drop":
            return Abort.DROP
        if mode == "hang":
            await asyncio.sleep(self._hang_seconds)
            return Abort.DROP
        if isinstance(mode, int):
            return self.error_response(request, mode, applied=None)
        return None

    def _call(self, request: Request, handler: Callable[[Request], _R]) -> _R | Response:
        """Run a fake's hook; a bug in it answers 500 instead of killing the connection."""
        try:
            return handler(request)
        except Exception:
            log.exception(
                "%s: handler failed for %s %s", type(self).__name__, request.method, request.path
            )
            return self.error_response(request, 500, applied=None)


def _test_ca() -> FakeCA:
    """The shared test CA, imported only for TLS: mitmproxy (the ``proxy`` extra) makes it."""
    try:
        from .tls import fake_ca
    except ImportError as exc:
        raise MissingDependency("mitmproxy", "proxy") from exc
    return fake_ca()
