"""Proxy edges through a real sidecar (mitmproxy, the addon, a real SQLite ledger) to real
servers on loopback that keep every byte they are sent.
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
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

from billing_support import recorder_sidecar
from harness import Sidecar
from rawproxy import ByteRecorder, client_tls

from ctrlrun.proxy.master import RELAYED_TRAILERS, TrailersLine
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
