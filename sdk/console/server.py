"""Starting the console: the listen address, the operators and their tokens, the ledger.

Everything is checked before the socket is bound, and each refusal is one line: no
``operators:`` in the policy, no operator with a token set, a non-loopback address without
``allow_remote``, a ledger that does not exist yet.

The server gives each connection a thread, up to ``max_connections`` at once. A connection
that is only waiting for its client (its TLS handshake, its first request, the next one on a
kept-alive connection, a request still arriving, or its client reading an answer) holds its
slot only until the cap is reached: a new connection then closes the one that has waited
longest, so clients that open connections and send nothing (or trickle bytes, or read no
answer) cannot lock operators out. When every slot is answering a request, a new connection
gets no thread: the accept loop answers it a 503 at once and closes it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import logging
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from ctrlrun.config import policy_path
from ctrlrun.errors import InvalidArgument, PolicyError
from ctrlrun.operators import OPERATORS
from ctrlrun.policy import Policy
from ctrlrun.store import NoLedger, StateStore, open_default_store

from . import auth
from .routes import App, Handler

log = logging.getLogger(__name__)
DEFAULT_LISTEN = "127.0.0.1:9091"
MAX_CONNECTIONS = 64  # connections served at once, a thread each; past it, a 503
REFUSAL_SEND_TIMEOUT = 0.1  # seconds the accept loop may spend writing a 503
REFUSAL_LOG_EVERY = 10.0  # seconds between the log lines that count refused connections
BUSY_BODY = b"the console is busy: try again in a moment\n"
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: " + str(len(BUSY_BODY)).encode() + b"\r\n"
    b"Retry-After: 1\r\n"
    b"Cache-Control: no-store\r\n"
    b"Connection: close\r\n\r\n" + BUSY_BODY
)


@dataclass(frozen=True)
class ConsoleSettings:
    """What ``ctrlrun console`` was asked for."""

    listen: str = DEFAULT_LISTEN
    store_url: str | None = None
    policy: str | None = None
    allow_remote: bool = False
    session_ttl: float = auth.SESSION_TTL
    login_delay: float = 0.5
    tls_cert: str | None = None  # PEM certificate chain: serve HTTPS (the cookie is Secure)
    tls_key: str | None = None  # its private key (default: in the certificate file)
    public_url: str | None = None  # what operators open when a TLS proxy is in front
    max_connections: int = MAX_CONNECTIONS  # served at once; more are answered 503


class ConsoleServer(ThreadingHTTPServer):
    """The HTTP server, a thread per connection up to a cap, holding the console's ``App``."""

    daemon_threads = True
    block_on_close = False
    # Connections the kernel holds for accept(): past the default 5 a burst has its SYNs
    # dropped (a second's wait, then three) even though each refusal takes the loop no time.
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        app: App,
        tls: ssl.SSLContext | None = None,
        *,
        max_connections: int = MAX_CONNECTIONS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.app = app
        self.max_connections = max_connections
        self._slots_lock = threading.Lock()
        # The connections holding a slot: since when each has waited for its client (None
        # while it answers a request). Dicts keep insertion order; the oldest wait goes first.
        self._open: dict[Any, int | None] = {}
        self._ticks = itertools.count()  # orders the waits
        self._clock = clock
        self._refused = 0  # connections refused since the last line about them
        self._refused_logged: float | None = None
        super().__init__(address, Handler)
        if tls is not None:
            # The handshake runs in the request's thread (Handler.setup), not in accept().
            self.socket = tls.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )
            app.secure = True

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), int(self.server_address[1])
        shown = f"[{host}]" if ":" in host else host
        return f"{self.app.scheme}://{shown}:{port}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up or fails its TLS handshake: one line, never a traceback.
        exc = sys.exc_info()[1]
        log.info("console: a connection from %s ended: %s", client_address[0], type(exc).__name__)

    # -- the cap: process_request runs on the accept loop, the rest on the connection's thread

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._take_slot(request):
            self._refuse(request, client_address)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._give_back(request)  # no thread started (none left?): nothing else gives it back
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        # The slot is given back once the connection is closed, however it ended: a request
        # that raised, a client that hung up, a TLS handshake that failed or timed out.
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._give_back(request)

    def waiting(self, request: Any) -> None:
        """The connection waits for its client (the next request): another may take its slot."""
        with self._slots_lock:
            if request in self._open and self._open[request] is None:  # it answered one
                self._open[request] = next(self._ticks)

    def serving(self, request: Any) -> bool:
        """The connection's request has arrived: it keeps its slot until it has answered.
        False when it was already closed to make room (then nothing of it may run)."""
        with self._slots_lock:
            if request not in self._open:
                return False
            self._open[request] = None
            return True

    def _take_slot(self, request: Any) -> bool:
        with self._slots_lock:
            if len(self._open) >= self.max_connections:
                idle = {c: since for c, since in self._open.items() if since is not None}
                if not idle:
                    return False
                victim = min(idle, key=idle.__getitem__)
                del self._open[victim]
                _hang_up(victim)
            self._open[request] = next(self._ticks)
            return True

    def _give_back(self, request: Any) -> None:
        with self._slots_lock:
            self._open.pop(request, None)

    def _refuse(self, request: socket.socket, client_address: Any) -> None:
        """A connection past the cap: a 503 if it can be written at once, then closed."""
        if not isinstance(request, ssl.SSLSocket):
            # Only written, never a read of the request: the loop must not wait on a client.
            try:
                request.settimeout(REFUSAL_SEND_TIMEOUT)
                request.sendall(BUSY)
            except OSError:
                pass
        # Over TLS nothing can be written before a handshake, and a handshake is the slow
        # work a thread is kept for: the connection is only closed (the client sees EOF).
        self.shutdown_request(request)
        self._refused += 1
        now = self._clock()
        if self._refused_logged is None or now - self._refused_logged >= REFUSAL_LOG_EVERY:
            log.warning(
                "console: %d connection(s) refused, %d already open (the cap); latest from %s",
                self._refused,
                self.max_connections,
                client_address[0],
            )
            self._refused, self._refused_logged = 0, now


def _hang_up(sock: socket.socket) -> None:
    """End a waiting connection from another thread: its blocked read returns at once."""
    # The plain socket's shutdown, also under TLS: SSLSocket.shutdown drops its SSL object,
    # which the connection's own thread is using. An OSError: its client closed it already.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidArgument(f"--listen {text!r}: expected HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return host, int(port)


def parse_public_url(text: str) -> tuple[str, str]:
    """``https://console.example.com[:PORT]`` -> (its origin, its ``Host`` value), lowercased."""
    parts = urlsplit(text.strip())
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
        raise InvalidArgument(
            f"--public-url {text!r}: expected the address operators open, "
            "e.g. https://console.example.com"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise InvalidArgument(
            f"--public-url {text!r}: the console is served at / (no path, query or user)"
        )
    netloc = parts.netloc.lower()
    host = netloc.removesuffix({"http": ":80", "https": ":443"}[parts.scheme])
    return f"{parts.scheme}://{host}", host


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


def answers_to(host: str, port: int) -> frozenset[str] | None:
    """The ``Host`` header values the console accepts; None when it listens on every address."""
    if host in ("0.0.0.0", "::", ""):
        return None
    names = {f"[{host}]:{port}" if ":" in host else f"{host}:{port}"}
    if is_loopback(host):
        names |= {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}
    return frozenset(n.lower() for n in names)


def load_tokens(
    policy: Policy, environ: Mapping[str, str] | None
) -> tuple[dict[str, str], list[str]]:
    """The operators' tokens, and what to warn about at start (an operator with no token set
    cannot log in; one with a short token can, but is easy to guess), or a one-line refusal."""
    path = policy.source
    operators = policy.section(OPERATORS)
    if not operators:
        raise PolicyError(
            f"{path}: the console needs operators: add an `operators:` section "
            "(name: {token_env: VARIABLE}) and set each operator's token in that variable"
        )
    tokens, missing = auth.tokens_from_env(operators, environ)
    if not tokens:
        raise PolicyError(
            f"{path}: no operator can log in: set the token of at least one of "
            + ", ".join(missing)
            + " (e.g. openssl rand -hex 24)"
        )
    warnings = [f"operator {who} has no token set and cannot log in" for who in missing]
    warnings += [
        f"operator {who}: its token has fewer than {auth.MIN_TOKEN} characters and is easy "
        "to guess: set a longer one (openssl rand -hex 24)"
        for who in auth.weak(operators, tokens)
    ]
    return tokens, warnings


def build(settings: ConsoleSettings, environ: Mapping[str, str] | None = None) -> ConsoleServer:
    """Check everything and bind the listener (not yet serving: ``serve_forever``)."""
    host, port = parse_listen(settings.listen)
    if not is_loopback(host) and not settings.allow_remote:
        raise InvalidArgument(
            f"--listen {settings.listen} is not a loopback address: the console answers "
            "operators' tokens and session cookies: pass --allow-remote to listen there "
            "(and serve it with --tls-cert, or behind a TLS proxy)"
        )
    if settings.max_connections < 1:
        raise InvalidArgument(f"--max-connections {settings.max_connections}: at least 1")
    public = None if settings.public_url is None else parse_public_url(settings.public_url)
    policy = Policy.from_file(policy_path(settings.policy))
    tokens, warnings = load_tokens(policy, environ)
    tls = _tls(settings)
    store = _ledger(settings)
    app = App(
        store=store,
        tokens=tokens,
        sessions=auth.Sessions(ttl=settings.session_ttl),
        hosts=None,
        login_delay=settings.login_delay,
        public_origin=None if public is None else public[0],
        actions=frozenset(policy.actions),
    )
    try:
        server = ConsoleServer((host, port), app, tls, max_connections=settings.max_connections)
    except OSError as exc:
        store.close()
        raise InvalidArgument(f"--listen {settings.listen}: {exc.strerror or exc}") from exc
    app.hosts = answers_to(host, int(server.server_address[1]))
    if app.hosts is not None and public is not None:  # the Host a proxy passes on as sent
        app.hosts |= {public[1]}
    for warning in warnings:  # only once it starts: a refusal above stays one line
        log.warning("console: %s", warning)
    return server


def _tls(settings: ConsoleSettings) -> ssl.SSLContext | None:
    if settings.tls_cert is None:
        if settings.tls_key is not None:
            raise InvalidArgument("--tls-key needs --tls-cert")
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(settings.tls_cert, settings.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidArgument(
            f"--tls-cert {settings.tls_cert}: cannot load the certificate and key ({exc})"
        ) from exc
    return context


def _ledger(settings: ConsoleSettings) -> StateStore:
    try:
        return open_default_store(settings.store_url, settings.policy, create=False)
    except NoLedger as exc:
        raise InvalidArgument(
            f"{exc} (the console never creates one: set --store-url, or start the proxy first)"
        ) from exc
