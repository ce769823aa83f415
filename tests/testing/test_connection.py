"""The fakes' HTTP/1.1 framing (h11): what a client on a raw socket sees."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from ctrlrun.testing import FakeServer, Request, Response
from ctrlrun.testing.connection import MAX_BODY_BYTES


class Echo(FakeServer):
    """Answers every request with its method, path and body length."""

    def handle(self, request: Request) -> Response:
        return Response.json(200, [request.method, request.path, len(request.body)])

    def error_response(
        self, request: Request, status: int, *, applied: Response | None
    ) -> Response:
        return Response.json(status, {"error": status})


@pytest.fixture
def echo() -> Iterator[Echo]:
    with Echo() as server:
        yield server


def connect(server: FakeServer) -> socket.socket:
    return socket.create_connection((server.host, server.port), timeout=5)


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_expect_100_continue_is_answered_before_the_body(echo: Echo) -> None:
    with connect(echo) as sock:
        sock.sendall(
            b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"
        )
        assert sock.recv(1024).startswith(b"HTTP/1.1 100 ")
        sock.sendall(b"abc")
        sock.shutdown(socket.SHUT_WR)
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b'["POST","/x",3]')


def test_head_gets_the_headers_of_get_and_no_body(echo: Echo) -> None:
    with connect(echo) as sock:
        sock.sendall(b"HEAD /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        head, _, body = read_all(sock).partition(b"\r\n\r\n")
    assert b"Content-Length: 15" in head and body == b""  # the length GET would have


def test_pipelined_requests_are_answered_in_order(echo: Echo) -> None:
    with connect(echo) as sock:
        sock.sendall(
            b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        answer = read_all(sock)
    assert answer.index(b'"/a"') < answer.index(b'"/b"')
    assert echo.requests == [("GET", "/a"), ("GET", "/b")]


def test_http_1_0_is_answered_then_closed(echo: Echo) -> None:
    with connect(echo) as sock:
        sock.sendall(b"GET /x HTTP/1.0\r\n\r\n")
        answer = read_all(sock)  # returns only because the server closed
    assert answer.startswith(b"HTTP/1.1 200 OK") and b"Connection: close" in answer


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"NONSENSE\r\n\r\n", b"400"),
        (b"GET /x HTTP/1.1\r\nHost: x\r\nBad Header: x\r\n\r\n", b"400"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b"400"),  # a TLS ClientHello
        (b"GET /" + b"x" * 70_000, b"431"),  # a head that never ends
        (
            f"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode(),
            b"413",
        ),
    ],
)
def test_bytes_that_are_not_a_request_are_refused_and_never_handled(
    echo: Echo, raw: bytes, status: bytes
) -> None:
    with connect(echo) as sock:
        sock.sendall(raw)
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 " + status) and b"Connection: close" in answer
    assert echo.requests == []


def test_a_chunked_body_too_large_is_refused_as_it_arrives(echo: Echo) -> None:
    chunk = b"x" * (MAX_BODY_BYTES // 16)
    with connect(echo) as sock:
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(16):  # exactly the limit: still read
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        sock.sendall(b"1\r\nx\r\n")  # one byte over it
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 413") and echo.requests == []
