"""HTTP framing games through a real sidecar, to a server that keeps every byte it is sent.

A read is relayed as sent, so what it carries beyond a plain read must not reach the remote:
a body on a GET (a server that does not read it takes it for the next request on the
connection: a write nobody decided) and a header folded over two lines (a server that starts
a new header at the second line reads one ctrlrun never saw). Conflicting lengths, unknown
transfer codings and pipelined writes are mitmproxy's to refuse or to hand to the guard one by
one; they are pinned here too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from billing_support import DENY_SEND, recorder_sidecar
from harness import Sidecar
from rawproxy import ByteRecorder, exchange

pytestmark = pytest.mark.timeout(120)

POLICY = DENY_SEND


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[Sidecar, ByteRecorder]]:
    with recorder_sidecar(tmp_path, POLICY) as both:
        yield both


SMUGGLED = b"POST /v1/invoices/in_1/send HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"


def head(port: int, line: bytes, *headers: bytes) -> bytes:
    method, path = line.split(b" ", 1)
    lines = [b"%s http://127.0.0.1:%d%s HTTP/1.1" % (method, port, path)]
    lines += [b"Host: 127.0.0.1:%d" % port, *headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def attacks(port: int) -> dict[str, bytes]:
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(SMUGGLED), SMUGGLED)
    return {
        "get-body": head(port, b"GET /v1/x", b"Content-Length: %d" % len(SMUGGLED)) + SMUGGLED,
        "get-chunked-body": head(port, b"GET /v1/x", b"Transfer-Encoding: chunked") + chunked,
        "options-body": head(port, b"OPTIONS /v1/x", b"Content-Length: 1") + b"x",
        "get-obs-fold": head(port, b"GET /v1/x", b"X-A: a", b" X-HTTP-Method-Override: POST"),
        # Rack and CGI read '_' as '-': this is the override header there.
        "get-underscore-override": head(port, b"GET /v1/x", b"X_HTTP_METHOD_OVERRIDE: POST"),
    }


@pytest.mark.parametrize(
    "name",
    ["get-body", "get-chunked-body", "options-body", "get-obs-fold", "get-underscore-override"],
)
def test_a_read_carrying_more_than_a_read_is_refused_unforwarded(
    rig: tuple[Sidecar, ByteRecorder], name: str
) -> None:
    sc, upstream = rig
    got = exchange(sc.proxy_url, attacks(upstream.port)[name])
    assert got.startswith(b"HTTP/1.1 4"), got[:200]
    assert b"X-Ctrlrun-Outcome: invalid_request" in got, got[:400]
    assert bytes(upstream.received) == b""
    # A plain read still passes.
    got = exchange(sc.proxy_url, head(upstream.port, b"GET /v1/x"), wait=2)
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"ok"), got[:200]
    assert bytes(upstream.received).startswith(b"GET /v1/x HTTP/1.1\r\n")


def test_a_write_with_a_folded_header_is_refused_unforwarded(
    rig: tuple[Sidecar, ByteRecorder],
) -> None:
    sc, upstream = rig
    data = head(upstream.port, b"POST /v1/other", b"X-A: a", b" b", b"Content-Length: 0")
    got = exchange(sc.proxy_url, data)
    assert got.startswith(b"HTTP/1.1 4") and b"invalid_request" in got, got[:400]
    assert bytes(upstream.received) == b""


@pytest.mark.parametrize(
    "headers",
    [
        (b"Content-Length: 0", b"Transfer-Encoding: chunked"),
        (b"Content-Length: 0", b"Content-Length: 5"),
        (b"Transfer-Encoding: chunked, identity",),
        (b"Transfer-Encoding: gzip",),
        (b"Transfer-Encoding : chunked",),
    ],
)
def test_conflicting_framing_is_refused_by_the_proxy(
    rig: tuple[Sidecar, ByteRecorder], headers: tuple[bytes, ...]
) -> None:
    sc, upstream = rig
    got = exchange(sc.proxy_url, head(upstream.port, b"GET /v1/x", *headers) + b"0\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 400"), got[:200]
    assert bytes(upstream.received) == b""


def test_a_write_pipelined_after_a_read_is_guarded(rig: tuple[Sidecar, ByteRecorder]) -> None:
    sc, upstream = rig
    write = head(upstream.port, b"POST /v1/invoices/in_1/send", b"Content-Length: 0")
    got = exchange(sc.proxy_url, head(upstream.port, b"GET /v1/x") + write, answers=2)
    assert got.startswith(b"HTTP/1.1 200"), got[:200]
    assert b"X-Ctrlrun-Outcome: denied" in got, got[:600]
    assert bytes(upstream.received).count(b"HTTP/1.1\r\n") == 1
    assert b"POST" not in bytes(upstream.received)
