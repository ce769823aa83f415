"""A tunnel to a name of the upstream, through a real sidecar to a server that keeps every byte
it is sent, once the recogniser's table of learned names is full and the name's lookup has
expired (the agent waited after its CONNECT before sending anything): the denied write was
relayed raw to the upstream. It meets the gate now.

The table (4,096 names) and the lookup's lifetime (30 s) are made small here, so the test
fills one and outlives the other in a second; an agent does the same with 4,096 reads.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from billing_support import DENY_SEND, receipts, recorder_sidecar
from rawproxy import ByteRecorder, exchange

from ctrlrun.proxy import recognize

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
