"""Proxy edges through a real sidecar (mitmproxy, the addon, a real SQLite ledger) to real
servers on loopback that keep every byte they are sent: HTTP/2 trailers, control bytes in a
read's headers, an HTTP/2 host field, the sidecar's own listeners reached through it, and
HTTP/1.1 framings of a denied write (transfer codings, lengths, HTTP/1.0 keep-alive, a long
header, WebSocket and h2c upgrades, a write after a read in one segment).
"""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from billing_support import DENY_SEND, recorder_sidecar
from harness import Sidecar, start_sidecar
from rawproxy import ByteRecorder, Recorder, client_tls, connect, exchange, plain

from ctrlrun.proxy.master import RELAYED_TRAILERS, TrailersLine
from ctrlrun.testing import FakeKubernetes, FakeStripe
from ctrlrun.testing.tls import fake_ca

pytestmark = pytest.mark.timeout(240)

SEND = "/v1/invoices/in_1/send"
# The send is allowed: whatever is refused here is refused for its framing, not by the policy.
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  billing.send:
    effect: "send:{{invoice_id}}"
    decision: allow
upstreams:
  billing:
    profile: http
    url: URL
    routes:
      - {{method: POST, path: "/v1/invoices/{{invoice_id}}/send", action: billing.send}}
"""


@pytest.fixture
def tls_rig(tmp_path: Path) -> Iterator[tuple[Sidecar, ByteRecorder]]:
    ca = fake_ca()
    policy = POLICY.replace("URL", f"https://127.0.0.1:PORT\n    ca_file: {ca.ca_file}")
    with recorder_sidecar(tmp_path, policy, tls=ca.server_context()) as both:
        yield both


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[Sidecar, ByteRecorder]]:
    with recorder_sidecar(tmp_path, POLICY.replace("URL", "http://127.0.0.1:PORT")) as both:
        yield both


def h2_request(
    sc: Sidecar,
    port: int,
    fields: list[tuple[str, str]],
    *,
    method: str = "GET",
    path: str = "/v1/x",
    body: bytes = b"",
    trailers: list[tuple[str, str]] | None = None,
) -> int | None:
    """One request over HTTP/2 through a CONNECT tunnel; its status, or None (a reset)."""
    authority = f"127.0.0.1:{port}"
    head = [(":method", method), (":scheme", "https"), (":authority", authority), (":path", path)]
    ctx = client_tls(str(sc.workdir / "mitm" / "mitmproxy-ca-cert.pem"))
    ctx.set_alpn_protocols(["h2"])
    config = h2.config.H2Configuration(
        client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False
    )
    conn = h2.connection.H2Connection(config)
    with socket.create_connection(("127.0.0.1", int(sc.proxy_url.rsplit(":", 1)[1])), 20) as raw:
        raw.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        assert raw.recv(4096).startswith(b"HTTP/1.1 200")
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            conn.initiate_connection()
            last = not body and not trailers
            conn.send_headers(1, head + fields, end_stream=last)
            if body:
                conn.send_data(1, body, end_stream=not trailers)
            if trailers:
                conn.send_headers(1, trailers, end_stream=True)
            sock.sendall(conn.data_to_send())
            for _ in range(100):  # bounded: a handful of frames end the stream
                data = sock.recv(65536)
                if not data:
                    return None
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.ResponseReceived):
                        return int(dict(event.headers)[b":status"])
                    if isinstance(event, h2.events.StreamReset | h2.events.ConnectionTerminated):
                        return None
                sock.sendall(conn.data_to_send())
    return None


# -- HTTP/2 request trailers ---------------------------------------------------------------
# Trailer fields after an HTTP/2 body: mitmproxy wrote a read's head to the HTTP/1.1 server
# and then crashed with a traceback; ctrlrun's forwarder sent a write without them. Both are
# refused now, nothing sent, in one log line.

JSON = [("content-type", "application/json")]


@pytest.mark.parametrize(("method", "body"), [("GET", b""), ("POST", b"{}")])
def test_an_http2_request_with_trailers_is_refused_unforwarded(
    tls_rig: tuple[Sidecar, ByteRecorder], method: str, body: bytes
) -> None:
    sc, upstream = tls_rig
    fields = JSON if body else []
    trailers = [("x-amount", "900000")]
    got = h2_request(
        sc, upstream.port, fields, method=method, path=SEND, body=body, trailers=trailers
    )
    assert got == 400, got
    assert bytes(upstream.received) == b""
    log = sc.log.read_text()
    assert "Traceback" not in log and "trailer fields" in log, log[-2000:]
    # The same request without trailers goes through.
    assert h2_request(sc, upstream.port, fields, method=method, path=SEND, body=body) == 200
    assert bytes(upstream.received).startswith(f"{method} {SEND} HTTP/1.1".encode())


def test_mitmproxys_crash_on_trailers_to_an_http1_server_is_one_line() -> None:
    # A request to a host that is no upstream is mitmproxy's to relay: one warning line.
    try:
        raise AssertionError("Unexpected event: RequestTrailers(stream_id=1, trailers=...)")
    except AssertionError:
        record = logging.LogRecord(
            "mitmproxy.proxy.server", logging.ERROR, "", 0, "crashed", (), sys.exc_info()
        )
    assert TrailersLine().filter(record)
    assert (record.levelname, record.getMessage(), record.exc_info) == (
        "WARNING",
        RELAYED_TRAILERS,
        None,
    )


# -- control bytes in a read's headers ---------------------------------------------------------
# A read is relayed by mitmproxy as sent. Only a line break can end a header (or the request)
# early at an HTTP/1.1 server; a bare CR is one to some (Python's email parser), so a read
# holding either is the guard's, and refused. Other control bytes pass: no server reads them
# as a line's end.

SMUGGLED = f"POST {SEND} HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"


def read_head(port: int, *headers: bytes) -> bytes:
    lines = [b"GET http://127.0.0.1:%d/v1/x HTTP/1.1" % port, b"Host: 127.0.0.1:%d" % port]
    return b"\r\n".join([*lines, *headers]) + b"\r\n\r\n"


@pytest.mark.parametrize(
    "value",
    [
        b"a\r" + SMUGGLED.encode().replace(b"\r\n", b"\r"),
        b"a\rX-HTTP-Method-Override: POST",
    ],
)
def test_a_read_whose_header_holds_a_bare_cr_is_refused(
    rig: tuple[Sidecar, ByteRecorder], value: bytes
) -> None:
    sc, upstream = rig
    got = exchange(sc.proxy_url, read_head(upstream.port, b"X-A: " + value))
    assert got.startswith(b"HTTP/1.1 400") and b"invalid_request" in got, got[:300]
    assert bytes(upstream.received) == b""


@pytest.mark.parametrize("byte", [0x00, 0x0B, 0x0C, 0x1C, 0x1F, 0x7F])
def test_a_read_whose_header_holds_another_control_byte_is_relayed_as_one_request(
    rig: tuple[Sidecar, ByteRecorder], byte: int
) -> None:
    sc, upstream = rig
    value = b"a" + bytes([byte]) + SMUGGLED.encode().replace(b"\r\n", bytes([byte]))
    exchange(sc.proxy_url, read_head(upstream.port, b"X-A: " + value))
    received = bytes(upstream.received)
    assert b"\r\nPOST" not in received and received.count(b"\r\n\r\n") <= 1, received


@pytest.mark.parametrize(
    "fields",
    [
        [("x-a", f"a\r\n\r\n{SMUGGLED}")],
        [("x-a", f"a\n\n{SMUGGLED}")],
        [("x-a", "a\rX-HTTP-Method-Override: POST")],
        [("x-a", "a\x00b")],
    ],
)
def test_an_http2_read_whose_header_holds_a_line_break_is_refused(
    tls_rig: tuple[Sidecar, ByteRecorder], fields: list[tuple[str, str]]
) -> None:
    sc, upstream = tls_rig
    got = h2_request(sc, upstream.port, fields)
    received = bytes(upstream.received)
    assert b"POST" not in received and received.count(b"\r\n\r\n") <= 1, received
    if "\r" in fields[0][1] or "\n" in fields[0][1]:
        assert got is None or got >= 400, got
        assert received == b""


# -- the sidecar's own listeners through the proxy --------------------------------------------
# Through the proxy an agent reaches what the sidecar's host reaches: its own proxy listener
# (a hop back in) and its admin listener, which in compose only the sidecar's host can reach.
# Both are refused under every name for this host; other loopback servers still pass.


@pytest.fixture
def admin_rig(tmp_path: Path) -> Iterator[Sidecar]:
    with FakeStripe() as stripe, FakeKubernetes() as kube:
        sc = start_sidecar(tmp_path, stripe, kube, admin=True, in_process=True)
        try:
            yield sc
        finally:
            sc.stop()


OWN_SPELLINGS = [
    "127.0.0.1",
    "localhost",
    "LOCALHOST.",
    "127.1",
    "2130706433",
    "0x7f.0.0.1",
    "0",
    "0.0.0.0",
    "127.0.0.2",
    "[::ffff:127.0.0.1]",
    "[::1]",
]


@pytest.mark.parametrize("which", ["proxy", "admin"])
def test_the_sidecars_own_listener_is_refused_through_it(admin_rig: Sidecar, which: str) -> None:
    sc = admin_rig
    url = sc.proxy_url if which == "proxy" else sc.admin_url
    port = int(url.rsplit(":", 1)[1])
    proxy_port = int(sc.proxy_url.rsplit(":", 1)[1])
    for host in OWN_SPELLINGS:
        tunnel = connect(proxy_port, f"{host}:{port}", "GET", "/metrics", f"{host}:{port}")
        assert tunnel.status == 403 and tunnel.outcome == "denied", (host, tunnel)
        got = plain(proxy_port, "GET", f"http://{host}:{port}/metrics", f"{host}:{port}")
        assert got.status == 403 and got.outcome == "denied", (host, got)
        assert b"own listener" in got.body, got.body
    # The admin listener itself still answers whoever reaches it directly.
    with httpx.Client(trust_env=False, timeout=10) as direct:
        assert direct.get(f"{sc.admin_url}/healthz").text == "ok\n"


def test_another_loopback_server_still_passes(admin_rig: Sidecar) -> None:
    sc = admin_rig
    proxy_port = int(sc.proxy_url.rsplit(":", 1)[1])
    with Recorder() as other:
        got = plain(
            proxy_port, "GET", f"http://127.0.0.1:{other.port}/x", f"127.0.0.1:{other.port}"
        )
        assert got.status == 200, got
    receipts = [r for r in sc.cli("receipts", "--json").stdout.splitlines() if "own_listener" in r]
    assert receipts == []


@pytest.mark.parametrize("host", ["example.com", "127.0.0.2:1"])
def test_an_http2_host_header_other_than_the_authority_reaches_nothing(
    tls_rig: tuple[Sidecar, ByteRecorder], host: str
) -> None:
    # mitmproxy writes an HTTP/2 request's own host field, if any, as the HTTP/1.1 Host: the
    # server would route by a name the gate never judged (it judges :authority).
    sc, upstream = tls_rig
    assert h2_request(sc, upstream.port, [("host", host)]) is None
    got = h2_request(
        sc, upstream.port, [("host", host), *JSON], method="POST", path=SEND, body=b"{}"
    )
    assert got is None or got >= 400, got
    assert bytes(upstream.received) == b""


# -- a fresh pass on HTTP/1.1 framing, against a denied send ------------------------------------


@pytest.fixture
def denied(tmp_path: Path) -> Iterator[tuple[Sidecar, ByteRecorder]]:
    with recorder_sidecar(tmp_path, DENY_SEND) as both:
        yield both


def send_head(
    port: int, *headers: bytes, method: bytes = b"POST", version: bytes = b"1.1"
) -> bytes:
    lines = [b"%s http://127.0.0.1:%d%s HTTP/%s" % (method, port, SEND.encode(), version)]
    return b"\r\n".join([*lines, b"Host: 127.0.0.1:%d" % port, *headers]) + b"\r\n\r\n"


def framings(port: int) -> dict[str, bytes]:
    body = b"{}"
    chunked = b"2\r\n{}\r\n0\r\n\r\n"
    json = b"Content-Type: application/json"
    get = read_head(port)
    return {
        "xchunked": send_head(port, json, b"Transfer-Encoding: xchunked") + chunked,
        "two-te-fields": send_head(
            port, json, b"Transfer-Encoding: chunked", b"Transfer-Encoding: identity"
        )
        + chunked,
        "te-vertical-tab": send_head(port, json, b"Transfer-Encoding:\x0bchunked") + chunked,
        "te-http10": send_head(port, json, b"Transfer-Encoding: chunked", version=b"1.0") + chunked,
        "cl-plus": send_head(port, json, b"Content-Length: +2") + body,
        "cl-list": send_head(port, json, b"Content-Length: 2, 2") + body,
        "http10-keep-alive-then-write": read_head(port).replace(b"HTTP/1.1", b"HTTP/1.0", 1)[:-2]
        + b"Connection: keep-alive\r\n\r\n"
        + send_head(port, json, b"Content-Length: 2")
        + body,
        "long-header-then-write": get[:-2]
        + b"X-Pad: "
        + b"a" * 60_000
        + b"\r\n\r\n"
        + send_head(port, json, b"Content-Length: 2")
        + body,
        "websocket-post": send_head(
            port,
            json,
            b"Content-Length: 2",
            b"Connection: Upgrade",
            b"Upgrade: websocket",
            b"Sec-WebSocket-Version: 13",
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        )
        + body,
        "h2c-post": send_head(
            port,
            json,
            b"Content-Length: 2",
            b"Connection: Upgrade, HTTP2-Settings",
            b"Upgrade: h2c",
            b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA",
        )
        + body,
        "write-in-a-gets-segment-after-a-read": get
        + send_head(port, json, b"Content-Length: 2")
        + body,
    }


@pytest.mark.parametrize("name", list(framings(0)))
def test_a_denied_send_in_any_framing_never_arrives(
    denied: tuple[Sidecar, ByteRecorder], name: str
) -> None:
    sc, upstream = denied
    got = exchange(sc.proxy_url, framings(upstream.port)[name], answers=2)
    received = bytes(upstream.received)
    assert b"POST" not in received, (received, got[:400])
    assert b"/send" not in received, (received, got[:400])
    # The sidecar goes on serving.
    again = exchange(sc.proxy_url, read_head(upstream.port), wait=2)
    assert again.startswith(b"HTTP/1.1 200"), again[:200]


ALLOW_UNMAPPED = POLICY.replace("    routes:", "    unmapped_writes: allow\n    routes:").replace(
    "decision: allow", "decision: deny"
)


@pytest.fixture
def unmapped_rig(tmp_path: Path) -> Iterator[tuple[Sidecar, ByteRecorder]]:
    ca = fake_ca()
    policy = ALLOW_UNMAPPED.replace("URL", f"https://127.0.0.1:PORT\n    ca_file: {ca.ca_file}")
    with recorder_sidecar(tmp_path, policy, tls=ca.server_context()) as both:
        yield both


def test_an_http2_write_whose_path_a_server_reads_as_a_route_is_refused(
    unmapped_rig: tuple[Sidecar, ByteRecorder],
) -> None:
    # With unmapped_writes: allow, a :path that matches no route as spelt but that a server
    # reads as the denied send (absolute form, no leading '/', '//host') must not pass.
    sc, upstream = unmapped_rig
    absolute = f"http://127.0.0.1:{upstream.port}{SEND}"
    for path in [absolute, SEND.lstrip("/"), "*", f"//x{SEND}"]:
        got = h2_request(sc, upstream.port, JSON, method="POST", path=path, body=b"{}")
        assert got == 400, (path, got)
    assert bytes(upstream.received) == b""
    assert h2_request(sc, upstream.port, JSON, method="POST", path="/v1/other", body=b"{}") == 200
