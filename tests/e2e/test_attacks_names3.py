"""Other names for a guarded server, and framing around them, through a real sidecar to a
server that keeps every byte it is sent.

An address of the host's own interfaces (its LAN or pod address) reaches every server that
listens on all addresses, as most do, exactly as ``127.0.0.1`` does: a denied write to an
upstream at ``127.0.0.1`` sent to ``10.254.0.1`` reached it undecided. The test that shows it
runs in a network namespace of its own (``unshare -rn``), with that address on its loopback
interface, and is skipped where one cannot be made.

Over HTTP/2 a target and a header are length-prefixed fields, and mitmproxy wrote them out as
sent to an HTTP/1.1 upstream: a read whose ``:path`` held ``HTTP/1.1\r\n\r\nPOST /send``
delivered the denied write after it, and a read's ``content-length`` with no body made the
server take the next request on the connection for its body. Both are refused now.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import pytest
from billing_support import DENY_SEND, recorder_sidecar
from harness import Sidecar
from rawproxy import ByteRecorder, client_tls, exchange

from ctrlrun.testing.tls import fake_ca

pytestmark = pytest.mark.timeout(240)

POLICY = DENY_SEND
SEND = "/v1/invoices/in_1/send"
OWN_V4, OWN_V6 = "10.254.0.1", "fd00:254::1"  # put on the namespace's loopback interface
MARK = "RESULTS "


def absolute(authority: str, *, method: str = "POST", path: str = SEND, host: str = "") -> bytes:
    lines = [f"{method} http://{authority}{path} HTTP/1.1", f"Host: {host or authority}"]
    return ("\r\n".join([*lines, "Content-Length: 0"]) + "\r\n\r\n").encode()


def tunnel(authority: str, inner: bytes) -> bytes:
    return f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode() + inner


def own_address_attacks(port: int) -> dict[str, bytes]:
    v4, v6 = f"{OWN_V4}:{port}", f"[{OWN_V6}]:{port}"
    origin = f"POST {SEND} HTTP/1.1\r\nHost: {v4}\r\nContent-Length: 0\r\n\r\n".encode()
    return {
        "v4": absolute(v4),
        "v6": absolute(v6),
        "v6-zone": absolute(f"[{OWN_V6}%25lo]:{port}", host=v6),
        "v4-mapped": absolute(f"[::ffff:{OWN_V4}]:{port}"),
        "v4-connect": tunnel(v4, origin),
        "v4-host-only": tunnel(f"127.0.0.1:{port}", origin),
    }


def _inside(workdir: Path) -> None:
    """In the namespace: the host's own addresses, a server on all of them, and the attacks."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "addr", "add", f"{OWN_V4}/32", "dev", "lo"], check=True)
    subprocess.run(["ip", "addr", "add", f"{OWN_V6}/128", "dev", "lo", "nodad"], check=True)
    results: dict[str, list[str]] = {}
    with recorder_sidecar(workdir, POLICY, bind="::") as (sc, upstream):
        for name, data in own_address_attacks(upstream.port).items():
            got = exchange(sc.proxy_url, data, answers=2 if name.endswith("connect") else 1)
            results[name] = [got.decode("latin-1")[:400], bytes(upstream.received).decode()]
        read = absolute(f"{OWN_V4}:{upstream.port}", method="GET", path="/v1/x")
        got = exchange(sc.proxy_url, read)
        results["read"] = [got.decode("latin-1")[:400], bytes(upstream.received).decode()]
    results.update(_egress_inside(workdir / "egress"))
    print(MARK + json.dumps(results), flush=True)


def _egress_inside(workdir: Path) -> dict[str, list[str]]:
    """Egress that allows the host's own address allows no loopback listener with it."""
    other = ByteRecorder(answer=True, bind="::")
    policy = POLICY + f"egress:\n  default: deny\n  allow: [{OWN_V4}]\n"
    results = {}
    with recorder_sidecar(workdir, policy, bind="::") as (sc, _):
        for name, host in (("egress-own", OWN_V4), ("egress-loopback", "127.0.0.1")):
            read = absolute(f"{host}:{other.port}", method="GET", path="/v1/x")
            got = exchange(sc.proxy_url, read)
            results[name] = [got.decode("latin-1")[:400], bytes(other.received).decode()]
    other.sock.close()
    return results


def _namespace_refused() -> str | None:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare (util-linux) and ip (iproute2) to make a network namespace"
    try:
        subprocess.run(
            ["unshare", "-rn", "ip", "link", "set", "lo", "up"],
            check=True,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot make a network namespace here (unshare -rn): {exc}"
    return None


def test_a_write_to_an_address_of_the_hosts_own_interfaces_is_guarded(tmp_path: Path) -> None:
    refused = _namespace_refused()
    if refused:
        pytest.skip(refused)
    done = subprocess.run(
        ["unshare", "-rn", sys.executable, __file__, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=200,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    results = json.loads(lines[-1][len(MARK) :])
    for name in own_address_attacks(0):
        answer, received = results[name]
        assert "X-Ctrlrun-Outcome: denied" in answer, (name, answer)
        assert "POST" not in received, (name, received)
    answer, received = results["read"]
    assert answer.startswith("HTTP/1.1 200") and received.startswith("GET /v1/x "), answer
    answer, received = results["egress-own"]
    assert answer.startswith("HTTP/1.1 200") and received.startswith("GET /v1/x "), answer
    answer, received = results["egress-loopback"]
    assert "X-Ctrlrun-Outcome: denied" in answer and "egress" in answer, answer
    assert received.count("GET /v1/x ") == 1, received


TLS_POLICY = POLICY.replace(
    "url: http://127.0.0.1:PORT", "url: https://127.0.0.1:PORT\n    ca_file: CA"
)
SMUGGLED = f"POST {SEND} HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"
H2_ATTACKS = {
    "crlf-path": [(":path", f"/v1/x HTTP/1.1\r\nHost: a\r\n\r\n{SMUGGLED}GET /y")],
    "space-path": [(":path", f"/v1/x HTTP/1.1\r\n{SMUGGLED}")],
    "lf-path": [(":path", "/v1/x HTTP/1.1\nX: y\n\nPOST /v1/invoices/in_1/send")],
    "crlf-query": [(":path", f"/v1/x?a=b HTTP/1.1\r\n\r\n{SMUGGLED}")],
    "length-no-body": [(":path", "/v1/x"), ("content-length", str(len(SMUGGLED)))],
}


@pytest.fixture
def tls_rig(tmp_path: Path) -> Iterator[tuple[Sidecar, ByteRecorder]]:
    ca = fake_ca()
    policy = TLS_POLICY.replace("CA", str(ca.ca_file))
    with recorder_sidecar(tmp_path, policy, tls=ca.server_context()) as both:
        yield both


def h2_read(sc: Sidecar, port: int, fields: list[tuple[str, str]]) -> int | None:
    """A GET over HTTP/2 through a CONNECT tunnel; the status it got, or None (a reset)."""
    authority = f"127.0.0.1:{port}"
    head = [(":method", "GET"), (":scheme", "https"), (":authority", authority)]
    names = {name for name, _ in fields}
    headers = [(k, v) for k, v in head if k not in names] + fields
    if ":path" not in names:
        headers.insert(3, (":path", "/v1/x"))
    ctx = client_tls(str(sc.workdir / "mitm" / "mitmproxy-ca-cert.pem"))
    ctx.set_alpn_protocols(["h2"])
    config = h2.config.H2Configuration(
        client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False
    )
    conn = h2.connection.H2Connection(config)
    with socket.create_connection(("127.0.0.1", sc.proxy_port), 20) as raw:
        raw.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        assert raw.recv(4096).startswith(b"HTTP/1.1 200")
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            conn.initiate_connection()
            conn.send_headers(1, headers, end_stream=True)
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


@pytest.mark.parametrize("name", list(H2_ATTACKS))
def test_an_http2_read_an_http1_server_would_frame_as_more_is_refused(
    tls_rig: tuple[Sidecar, ByteRecorder], name: str
) -> None:
    sc, upstream = tls_rig
    status = h2_read(sc, upstream.port, H2_ATTACKS[name])
    assert status is None or status >= 400, status
    assert bytes(upstream.received) == b""
    # A plain read over HTTP/2 still passes.
    assert h2_read(sc, upstream.port, []) == 200
    assert bytes(upstream.received).startswith(b"GET /v1/x HTTP/1.1\r\n")


def spelt_attacks(port: int) -> dict[str, bytes]:
    up = f"127.0.0.1:{port}"
    origin = f"POST {SEND} HTTP/1.1\r\nHost: {up}\r\nContent-Length: 0\r\n\r\n".encode()
    return {
        "userinfo": absolute(f"u:p@{up}", host=up),
        "port-leading-zero": absolute(f"127.0.0.1:0{port}", host=up),
        "zone-id": absolute(f"[::1%25lo]:{port}", host=up),
        "ipv4-compatible": absolute(f"[::127.0.0.1]:{port}", host=up),
        "fullwidth": absolute(f"\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54:{port}"),
        "lower-case-method": absolute(up, method="post"),
        "second-host": absolute(up).replace(
            b"Content-Length", b"Host: example.com\r\nContent-Length"
        ),
        "http10-no-host": f"POST http://{up}{SEND} HTTP/1.0\r\nContent-Length: 0\r\n\r\n".encode(),
        "expect-continue": absolute(up).replace(
            b"Content-Length", b"Expect: 100-continue\r\nContent-Length"
        ),
        "bare-lf": absolute(up).replace(b"\r\n", b"\n"),
        "connect-0port": tunnel(f"127.0.0.1:0{port}", origin),
        "connect-then-absolute-other": tunnel(up, absolute("example.com", host="example.com")),
        "connect-h2-preface": tunnel(up, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
    }


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[Sidecar, ByteRecorder]]:
    with recorder_sidecar(tmp_path, POLICY) as both:
        yield both


@pytest.mark.parametrize("name", list(spelt_attacks(0)))
def test_a_denied_write_under_another_spelling_or_framing_never_arrives(
    rig: tuple[Sidecar, ByteRecorder], name: str
) -> None:
    sc, upstream = rig
    got = exchange(sc.proxy_url, spelt_attacks(upstream.port)[name], answers=2)
    assert b"HTTP/1.1 200 OK" not in got.replace(b"200 Connection established", b""), got
    assert b"POST" not in bytes(upstream.received), bytes(upstream.received)


if __name__ == "__main__":
    _inside(Path(sys.argv[1]))
