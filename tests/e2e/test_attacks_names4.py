"""Other names for the upstream through a real sidecar to servers that keep every byte sent.

A tunnel to a name of the upstream, once the recogniser's table of learned names is full and
the name's lookup has expired (the agent waited after its CONNECT before sending anything):
the denied write was relayed raw to the upstream. It meets the gate now. The table (4,096
names) and the lookup's lifetime (30 s) are made small here, so the test fills one and
outlives the other in a second; an agent does the same with 4,096 reads.

A request line in absolute-form (``POST http://UPSTREAM/... HTTP/1.1``) names where it goes,
and RFC 9112 has a server read that name over the Host header: a front end serving an allowed
host and the upstream on one address (a CDN, a shared ingress), or a forward proxy, routes it
to the upstream. In transparent mode, inside a tunnel and on a reverse listener mitmproxy sent
it on as written, judged by its Host alone; a tunnel to another host was relayed raw with it.
It is intercepted now and sent on in origin-form, so the server reads the Host that was judged.
Transparent mode runs here in process, mitmproxy asked for each connection's original
destination from a table (what netfilter's redirect would answer).
"""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from billing_support import DENY_SEND, receipts, recorder_sidecar
from harness import Sidecar, free_port
from mitmproxy import platform
from rawproxy import ByteRecorder, exchange

from ctrlrun.proxy import recognize, server

pytestmark = pytest.mark.timeout(120)

SEND = "/v1/invoices/in_1/send"
TTL = 0.5


def _quiet_read(sock: socket.socket, wait: float = 3.0) -> bytes:
    got, deadline = b"", time.monotonic() + wait
    sock.settimeout(wait)
    while time.monotonic() < deadline and b"\r\n\r\n" not in got:
        try:
            chunk = sock.recv(65536)
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    return got


def late_tunnel(proxy_url: str, authority: str, inner: bytes) -> bytes:
    """CONNECT ``authority``, wait past the lookup's lifetime, then send ``inner``."""
    host, port = proxy_url.rsplit("/", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        assert _quiet_read(sock).startswith(b"HTTP/1.1 200"), authority
        time.sleep(TTL * 3)  # not a timing assertion: the cached lookup must have expired
        sock.sendall(inner)
        return _quiet_read(sock)


def test_a_late_write_into_a_tunnel_to_a_name_of_the_upstream_is_guarded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recognize, "MAX_CACHED", 3)
    monkeypatch.setattr(recognize, "DEFAULT_TTL", TTL)
    other = ByteRecorder(answer=True)  # another server: a tunnel to it stays untouched
    try:
        with recorder_sidecar(tmp_path, DENY_SEND) as (sc, upstream):
            p = upstream.port
            for i in range(2, 6):  # fills the table of learned names
                read = f"GET http://127.0.0.{i}:{p}/v1/x HTTP/1.1\r\nHost: 127.0.0.{i}:{p}\r\n\r\n"
                assert exchange(sc.proxy_url, read.encode()).startswith(b"HTTP/1.1 200")
            for name in ("localhost", "LocalHost."):
                write = f"POST {SEND} HTTP/1.1\r\nHost: {name}:{p}\r\nContent-Length: 0\r\n\r\n"
                got = late_tunnel(sc.proxy_url, f"{name}:{p}", write.encode())
                assert b"X-Ctrlrun-Outcome: denied" in got, (name, got[:300])
            assert b"POST" not in bytes(upstream.received), bytes(upstream.received)
            assert receipts(sc).count(("billing.send", "denied")) == 2
            # A tunnel to a server that is no upstream is pinned to its address: untouched.
            read = f"GET /v1/y HTTP/1.1\r\nHost: localhost:{other.port}\r\n\r\n".encode()
            got = late_tunnel(sc.proxy_url, f"localhost:{other.port}", read)
            assert got.startswith(b"HTTP/1.1 200"), got[:300]
            assert bytes(other.received).startswith(b"GET /v1/y HTTP/1.1\r\n")
    finally:
        other.sock.close()


def absolute(authority: str, host: str, method: str = "POST") -> bytes:
    return (
        f"{method} http://{authority}{SEND} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n"
    ).encode()


@pytest.fixture
def other() -> Iterator[ByteRecorder]:
    server_ = ByteRecorder(answer=True)  # a server that is no upstream
    yield server_
    server_.sock.close()


def test_a_tunnel_to_another_host_naming_the_upstream_in_its_request_line_is_intercepted(
    tmp_path: Path, other: ByteRecorder
) -> None:
    with recorder_sidecar(tmp_path, DENY_SEND) as (sc, upstream):
        here = f"localhost:{other.port}"
        inner = absolute(f"127.0.0.1:{upstream.port}", here)
        connect = f"CONNECT {here} HTTP/1.1\r\nHost: {here}\r\n\r\n".encode()
        got = exchange(sc.proxy_url, connect + inner, answers=2)
        assert got.startswith(b"HTTP/1.1 200 Connection established"), got[:300]
        assert bytes(upstream.received) == b""
        # Intercepted: sent on to the host the tunnel and its Host name, in origin-form.
        assert bytes(other.received).startswith(f"POST {SEND} HTTP/1.1\r\n".encode())


def test_a_reverse_listener_sends_an_absolute_form_read_on_in_origin_form(
    tmp_path: Path,
) -> None:
    port = free_port()
    policy = DENY_SEND.replace(
        "    url: http://127.0.0.1:PORT\n",
        f"    url: http://127.0.0.1:PORT\n    listen: 127.0.0.1:{port}\n",
    )
    with recorder_sidecar(tmp_path, policy) as (_, upstream):
        read = b"GET http://elsewhere.example/v1/x HTTP/1.1\r\nHost: a\r\n\r\n"
        got = exchange(f"http://127.0.0.1:{port}", read)
        assert got.startswith(b"HTTP/1.1 200"), got[:300]
        assert bytes(upstream.received).startswith(b"GET /v1/x HTTP/1.1\r\n"), upstream.received
        got = exchange(f"http://127.0.0.1:{port}", absolute("elsewhere.example", "a"))
        assert b"X-Ctrlrun-Outcome: denied" in got, got[:300]
        assert b"POST" not in bytes(upstream.received)


@pytest.fixture
def transparent(monkeypatch: pytest.MonkeyPatch) -> dict[int, tuple[str, int]]:
    """Transparent mode in process: each connection's original destination from a table,
    keyed by the client's own port."""
    table: dict[int, tuple[str, int]] = {}
    monkeypatch.setattr(platform, "original_addr", lambda sock: table[sock.getpeername()[1]])
    monkeypatch.setattr(platform, "init_transparent_mode", lambda: None)
    monkeypatch.setattr(
        server, "ProxySettings", functools.partial(server.ProxySettings, mode="transparent")
    )
    return table


def redirected(
    sc: Sidecar, table: dict[int, tuple[str, int]], to: tuple[str, int], data: bytes
) -> bytes:
    """``data`` on a connection the kernel would have redirected from ``to`` to the proxy."""
    host, port = sc.proxy_url.rsplit("/", 1)[1].split(":")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        table[sock.getsockname()[1]] = to
        sock.settimeout(3)
        sock.connect((host, int(port)))
        sock.sendall(data)
        return _quiet_read(sock)


@pytest.mark.parametrize("egress", ["", "egress:\n  default: deny\n  allow: [localhost]\n"])
def test_in_transparent_mode_a_write_reaches_the_upstream_only_decided(
    tmp_path: Path,
    other: ByteRecorder,
    transparent: dict[int, tuple[str, int]],
    egress: str,
) -> None:
    with recorder_sidecar(tmp_path, DENY_SEND + egress) as (sc, upstream):
        up, elsewhere = ("127.0.0.1", upstream.port), ("127.0.0.1", other.port)
        u, o = f"127.0.0.1:{upstream.port}", f"localhost:{other.port}"
        origin = f"POST {SEND} HTTP/1.1\r\nHost: {{}}\r\nContent-Length: 0\r\n\r\n"
        for to, data in [
            (up, origin.format(u).encode()),
            (up, origin.format("").encode()),  # an empty Host: the address decides
            (up, origin.format(o).encode()),  # another server's name: a mismatch
            (up, origin.format("example.invalid").encode()),  # resolves nowhere
            (("::ffff:127.0.0.1", upstream.port), origin.format(u).encode()),
            (up, f"POST {SEND} HTTP/1.0\r\nContent-Length: 0\r\n\r\n".encode()),
            (up, absolute(o, o)),  # the request line names another server
            (up, b"\x00\x01" + origin.format(u).encode()),  # no HTTP: parsed, refused
        ]:
            got = redirected(sc, transparent, to, data)
            assert b"X-Ctrlrun-Outcome: denied" in got, (to, data, got[:300])
        # To another server, in absolute-form naming the upstream: sent there in origin-form.
        got = redirected(sc, transparent, elsewhere, absolute(u, o))
        assert got.startswith(b"HTTP/1.1 200"), got[:300]
        assert bytes(other.received).startswith(f"POST {SEND} HTTP/1.1\r\n".encode())
        assert bytes(upstream.received) == b""
