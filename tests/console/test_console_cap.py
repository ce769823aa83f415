"""The console's cap on connections: past it, while every slot answers a request, a new one gets
no thread, only a quick 503 (over TLS, a close), and the slots come back when connections end,
however they end. (A connection only waiting for its client gives its slot up: that is in
test_attacks_console2.py.)"""

from __future__ import annotations

import logging
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
from console_support import Ledger, client, new_ledger, running, self_signed

from ctrlrun.cli.console import console as console_command
from ctrlrun.console import ConsoleServer, ConsoleSettings, auth, build, routes, server
from ctrlrun.errors import InvalidArgument

pytestmark = pytest.mark.timeout(60)
REFUSED = re.compile(r"console: (\d+) connection\(s\) refused")
QUICK = 2.0  # seconds a refusal may take, far below the handler's 30 s


@pytest.fixture
def lg(tmp_path: Path) -> Ledger:
    return new_ledger(tmp_path)


def address(srv: ConsoleServer) -> tuple[str, int]:
    return str(srv.server_address[0]), int(srv.server_address[1])


@contextmanager
def idle(srv: ConsoleServer, n: int) -> Iterator[list[socket.socket]]:
    """``n`` connections that send nothing, all closed when the block ends."""
    with ExitStack() as stack:
        socks = []
        for _ in range(n):
            sock = stack.enter_context(socket.create_connection(address(srv), timeout=5))
            socks.append(sock)
        yield socks


@contextmanager
def answering(
    srv: ConsoleServer, n: int, monkeypatch: pytest.MonkeyPatch, tls: ssl.SSLContext | None = None
) -> Iterator[list[socket.socket]]:
    """``n`` connections each held answering a request (GET /held waits until the block ends)."""
    entered, release = threading.Semaphore(0), threading.Event()
    plain = routes.Handler._get

    def held(self: routes.Handler, app: routes.App, path: str) -> routes.Reply:
        if path != "/held":
            return plain(self, app, path)
        entered.release()
        release.wait(30)
        return routes.Reply(204)

    monkeypatch.setattr(routes.Handler, "_get", held)
    host, port = address(srv)
    with ExitStack() as stack:
        socks = []
        for _ in range(n):
            sock = stack.enter_context(socket.create_connection((host, port), timeout=5))
            if tls is not None:
                sock = stack.enter_context(tls.wrap_socket(sock, server_hostname=host))
            sock.sendall(f"GET /held HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            assert entered.acquire(timeout=5)
            socks.append(sock)
        try:
            yield socks
        finally:
            release.set()


def read_all(sock: socket.socket, deadline: float = QUICK) -> bytes:
    """What the server writes until it closes (a reset counts as a close), within a deadline."""
    sock.settimeout(deadline)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def refused(srv: ConsoleServer) -> tuple[bytes, float]:
    """A connection past the cap: what it was answered and how long that took."""
    started = time.monotonic()
    with socket.create_connection(address(srv), timeout=5) as sock:
        return read_all(sock), time.monotonic() - started


def get_login_within(srv: ConsoleServer, seconds: float = 5.0) -> httpx.Response:
    """GET /login until it is not a 503 (the held threads see their clients go), bounded."""
    deadline = time.monotonic() + seconds
    with client(srv) as c:
        while True:
            page = c.get("/login")
            if page.status_code != 503 or time.monotonic() > deadline:
                return page
            time.sleep(0.05)


def test_past_the_cap_a_connection_is_answered_503_at_once(
    lg: Ledger, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    at_info = caplog.at_level(logging.INFO, logger="ctrlrun.console")
    with running(lg, max_connections=3) as srv, answering(srv, 3, monkeypatch), at_info:
        answer, took = refused(srv)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
        assert b"\r\nRetry-After: 1" in head and b"\r\nConnection: close" in head
        assert body == server.BUSY_BODY
        assert took < QUICK
        with client(srv) as c:  # a real client that sent its request sees the same
            busy = c.get("/login")
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        for _ in range(20):  # a flood: one line, not one per connection
            refused(srv)
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "3 already open" in lines[0]


def test_a_flood_is_counted_in_one_log_line_per_interval(
    lg: Ledger, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [0.0]
    store = lg.store()
    app = routes.App(store=store, tokens={}, sessions=auth.Sessions(), hosts=None)
    srv = ConsoleServer(("127.0.0.1", 0), app, max_connections=1, clock=lambda: now[0])
    held, peer = socket.socketpair()
    try:
        entered, release = threading.Event(), threading.Event()

        def hold(self: routes.Handler, app: routes.App, path: str) -> routes.Reply:
            entered.set()
            release.wait(30)
            return routes.Reply(204)

        monkeypatch.setattr(routes.Handler, "_get", hold)
        srv.process_request(held, ("127.0.0.1", 1))  # the one slot: its thread answers a request
        peer.sendall(b"GET /login HTTP/1.1\r\nHost: x\r\n\r\n")
        assert entered.wait(5)
        with caplog.at_level(logging.INFO, logger="ctrlrun.console"):
            for at in (0.0, 1.0, 9.9, 10.0, 10.5, 25.0):
                now[0] = at
                ours, theirs = socket.socketpair()
                with theirs:
                    srv.process_request(ours, ("127.0.0.1", 2))
                    assert read_all(theirs).startswith(b"HTTP/1.1 503 ")
        said = [r.getMessage() for r in caplog.records]
        counts = [int(m.group(1)) for m in map(REFUSED.match, said) if m]
        assert counts == [1, 3, 2]  # at 0; then 1, 9.9 and 10; then 10.5 and 25
    finally:
        release.set()
        peer.close()
        srv.server_close()
        store.close()


def test_once_the_held_connections_close_a_request_is_served_again(
    lg: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running(lg, max_connections=3) as srv:
        for _ in range(2):  # the slots come back every time, not only once
            with answering(srv, 3, monkeypatch):
                assert refused(srv)[0].startswith(b"HTTP/1.1 503 ")
            page = get_login_within(srv)
            assert page.status_code == 200
            assert 'name="csrf"' in page.text


def test_the_threads_stay_bounded_while_fifty_connections_are_open(lg: Ledger) -> None:
    cap = 8
    with running(lg, max_connections=cap) as srv:
        before = threading.active_count()
        most = before
        with idle(srv, 50) as socks:
            # Each one past the cap closed the one that had waited longest: wait for each close,
            # then count again (a closed one's thread has ended by then or is ending).
            for sock in socks[:-cap]:
                assert read_all(sock) == b""
            deadline = time.monotonic() + 5
            while threading.active_count() > before + cap and time.monotonic() < deadline:
                time.sleep(0.05)
            most = max(most, threading.active_count())
        assert most <= before + cap, (before, most)
        assert get_login_within(srv).status_code == 200


def test_a_request_that_raised_gives_its_slot_back(
    lg: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: routes.Handler) -> None:
        raise RuntimeError("a bug in a page")

    with running(lg, max_connections=1) as srv:
        with monkeypatch.context() as patched:
            patched.setattr(routes.Handler, "do_GET", broken)
            for _ in range(3):
                with pytest.raises(httpx.HTTPError), client(srv) as c:
                    c.get("/login")
        assert get_login_within(srv).status_code == 200


def test_over_tls_a_connection_past_the_cap_is_only_closed(
    lg: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pem = self_signed(tmp_path)
    verify = ssl.create_default_context(cafile=str(pem))
    with running(lg, tls_cert=str(pem), max_connections=2) as srv:
        with answering(srv, 2, monkeypatch, verify):  # two requests being answered
            answer, took = refused(srv)
            assert answer == b"" and took < QUICK  # nothing can be written before a handshake
        for _ in range(4):  # handshakes that fail end their threads and free their slots
            with socket.create_connection(address(srv), timeout=5) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
                read_all(sock, 5.0)
        with httpx.Client(base_url=srv.url, verify=verify, timeout=10, trust_env=False) as c:
            assert c.get("/login").status_code == 200


def test_the_cap_is_at_least_one_and_the_cli_default_is_the_module_s(lg: Ledger) -> None:
    settings = ConsoleSettings(
        listen="127.0.0.1:0", store_url=lg.url, policy=str(lg.policy), max_connections=0
    )
    with pytest.raises(InvalidArgument, match="--max-connections 0"):
        build(settings, {"CONSOLE_ALICE": "x" * 16})
    option = next(p for p in console_command.params if p.name == "max_connections")
    assert option.default == server.MAX_CONNECTIONS == ConsoleSettings().max_connections
