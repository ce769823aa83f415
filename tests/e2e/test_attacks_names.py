"""Names of the guarded upstream beyond those ``test_recognition`` sends, and authorities
that disagree: each is sent through the real proxy to the fake cluster, with a denied scale.
No denied replica count may reach it, whatever the spelling, the port's zeros, a zone id,
userinfo, or a Host header naming another server than the request line."""

from __future__ import annotations

import socket
import time

import pytest
from harness import Sidecar
from rawproxy import connect, plain
from test_recognition import HEADERS, SCALE, guarded, scale

from ctrlrun.testing import FakeKubernetes

__all__ = ["guarded"]  # the fixture, shared with the recognition tests

MORE = [
    "127.000.000.001",
    "0x7F.1",
    "127.0.0.1.",
    "[0:0:0:0:0:0:0:1]",
    "[::ffff:127.0.0.2]",
    "[::]",
    "[::1%25lo]",
]


@pytest.mark.timeout(300)
def test_more_spellings_and_zero_padded_ports_never_reach_it_unguarded(
    guarded: tuple[Sidecar, FakeKubernetes],
) -> None:
    sc, kube = guarded
    p = sc.proxy_port
    tried = []
    for host in MORE:
        for port in (str(kube.port), f"0{kube.port}", f"00{kube.port}"):
            authority = f"{host}:{port}"
            for how in ("plain", "connect"):
                if how == "plain":
                    url = f"http://{authority}{SCALE}"
                    r = plain(p, "PATCH", url, authority, body=scale(77), headers=HEADERS)
                else:
                    r = connect(
                        p, authority, "PATCH", SCALE, authority, body=scale(77), headers=HEADERS
                    )
                tried.append((how, authority, r.status, r.outcome))
                assert (r.status, r.outcome) == (403, "denied"), (how, authority, r)
    assert kube.replicas("default", "checkout") == 3, tried
    assert kube.count("PATCH") == 0, tried


@pytest.mark.timeout(300)
def test_userinfo_and_a_disagreeing_host_header_do_not_carry_a_write_past_the_guard(
    guarded: tuple[Sidecar, FakeKubernetes],
) -> None:
    sc, kube = guarded
    p, k = sc.proxy_port, kube.port
    cases = [
        (f"http://user:pw@127.0.0.1:{k}{SCALE}", f"127.0.0.1:{k}"),
        (f"http://127.0.0.1:{k}{SCALE}", f"192.0.2.1:{k}"),
        (f"http://192.0.2.1:{k}{SCALE}", f"127.0.0.1:{k}"),
        (f"http://localhost:{k}{SCALE}", "localhost"),
        (f"http://localhost{SCALE}", f"localhost:{k}"),
    ]
    for url, host in cases:
        r = plain(p, "PATCH", url, host, body=scale(88), headers=HEADERS)
        assert r.status != 200, (url, host, r)
    for authority, host in [
        (f"192.0.2.1:{k}", f"127.0.0.1:{k}"),
        (f"127.0.0.1:{k}", f"localhost:{k + 1}"),
        (f"127.0.0.1:{k}", "localhost"),
    ]:
        r = connect(p, authority, "PATCH", SCALE, host, body=scale(88), headers=HEADERS)
        assert r.status != 200, (authority, host, r)
    assert kube.replicas("default", "checkout") == 3
    assert kube.count("PATCH") == 0


def tunnel(p: int, authority: str, data: bytes, wait: float = 3.0) -> bytes:
    """CONNECT ``authority``, send ``data`` raw inside, and what came back before it went quiet."""
    with socket.create_connection(("127.0.0.1", p), timeout=wait) as sock:
        sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        got, deadline = b"", time.monotonic() + wait
        sent = False
        while time.monotonic() < deadline:
            if not sent and b"\r\n\r\n" in got:
                if not got.startswith(b"HTTP/1.1 200"):
                    return got
                got, sent = b"", True
                sock.sendall(data)
            try:
                chunk = sock.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            got += chunk
        return got


def raw(target: str, host: str, body: bytes, *extra: str) -> bytes:
    lines = [f"PATCH {target} HTTP/1.1", f"Host: {host}", *extra]
    lines.append("Content-Type: application/merge-patch+json")
    if not any(e.lower().startswith(("content-length", "transfer-encoding")) for e in extra):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@pytest.mark.timeout(300)
def test_a_tunnel_carries_no_denied_write_by_upgrade_framing_or_a_second_request(
    guarded: tuple[Sidecar, FakeKubernetes],
) -> None:
    sc, kube = guarded
    p, k = sc.proxy_port, kube.port
    here, body = f"127.0.0.1:{k}", scale(99)
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    get = f"GET {SCALE} HTTP/1.1\r\nHost: {here}\r\n\r\n".encode()
    cases = [
        get + raw(SCALE, here, body),
        get + raw(SCALE, f"192.0.2.1:{k}", body),
        raw(f"http://{here}{SCALE}", "192.0.2.1", body),
        raw(
            SCALE,
            here,
            body,
            "Connection: Upgrade, HTTP2-Settings",
            "Upgrade: h2c",
            "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA",
        ),
        raw(
            SCALE,
            here,
            body,
            "Connection: Upgrade",
            "Upgrade: websocket",
            "Sec-WebSocket-Version: 13",
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        ),
        raw(SCALE, here, chunked, "Transfer-Encoding: chunked", f"Content-Length: {len(body)}"),
        raw(SCALE, here, chunked.replace(b"\r\n", b";x=1\r\n", 1), "Transfer-Encoding: chunked"),
        raw(SCALE, here, body, "Expect: 100-continue"),
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    ]
    control = tunnel(p, here, raw(SCALE, here, scale(5)))  # the helper reaches the remote
    assert control.startswith(b"HTTP/1.1 200"), control
    for data in cases:
        got = tunnel(p, here, data)
        assert b'"replicas":99' not in got.replace(b" ", b""), (data, got)
    assert kube.replicas("default", "checkout") == 5
    assert kube.count("PATCH") == 1


def utf8_exchange(p: int, data: bytes, wait: float = 3.0) -> bytes:
    with socket.create_connection(("127.0.0.1", p), timeout=wait) as sock:
        sock.sendall(data)
        got, deadline = b"", time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            got += chunk
        return got


@pytest.mark.timeout(300)
def test_ports_python_would_parse_and_unicode_names_idna_would_fold_are_refused(
    guarded: tuple[Sidecar, FakeKubernetes],
) -> None:
    """``int()`` takes ``+N``, ``4_1631`` and non-ASCII digits; IDNA folds full-width letters
    and the ideographic full stop. None of them may name the upstream without its guard."""
    sc, kube = guarded
    p, k = sc.proxy_port, str(kube.port)
    wide = str.maketrans("0123456789", "０１２３４５６７８９")
    ports = [f"+{k}", f"{k[0]}_{k[1:]}", f" {k}", k.translate(wide)]
    hosts = ["ｌｏｃａｌｈｏｓｔ", "１２７.0.0.1", "localhost\u3002", "127\u30020\u30020\u30021"]
    names = [f"127.0.0.1:{port}" for port in ports] + [f"{h}:{k}" for h in hosts]
    for authority in names:
        got = utf8_exchange(p, raw(f"http://{authority}{SCALE}", authority, scale(99)))
        assert not got.startswith(b"HTTP/1.1 200"), (authority, got)
        got = tunnel(p, authority, raw(SCALE, authority, scale(99)))
        assert not got.startswith(b"HTTP/1.1 200"), (authority, got)
    assert kube.replicas("default", "checkout") == 3
    assert kube.count("PATCH") == 0
