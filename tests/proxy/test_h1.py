"""The HTTP/1.1 client against real loopback servers: bodies, reuse, and how far a request got."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from ctrlrun.proxy import h1
from ctrlrun.proxy.classify import Transport
from ctrlrun.proxy.config import Upstream
from ctrlrun.proxy.forward import Forwarder
from ctrlrun.testing import FakeStripe

AUTH = [("Authorization", "Bearer sk_test_fake123")]
REFUND = b"payment_intent=pi_1&amount=100"
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Scripted:
    """A loopback server running ``handler`` per connection; keeps what it read, counts."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.heads: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Scripted:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.transport.abort()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                return await reader.readexactly(int(line.split(b":")[1]))
        return b""

    def pool(self, **kw: Any) -> h1.Pool:
        kw.setdefault("timeout", 5.0)
        return h1.Pool("http", "127.0.0.1", self.port, **kw)


def answering(*responses: bytes, then_close: bool = False) -> Callable[[Scripted], Handler]:
    """A handler answering each request on a connection with the next of ``responses``."""

    def bind(server: Scripted) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for response in responses:
                await server.read_request(reader)
                writer.write(response)
                await writer.drain()
            if not then_close:
                await reader.read()  # hold it open until the client goes

        return handler

    return bind


def run(make: Callable[[Scripted], Handler], go: Callable[[Scripted], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        server = Scripted(lambda r, w: asyncio.sleep(0))
        server.handler = make(server)
        async with server:
            return await go(server)

    return asyncio.run(main())


def exchange(server: Scripted, *sends: tuple[str, bytes], **kw: Any) -> Any:
    async def go() -> list[h1.Response | h1.RequestFailed]:
        pool = server.pool(**kw)
        out: list[h1.Response | h1.RequestFailed] = []
        try:
            for method, body in sends:
                try:
                    out.append(await pool.request(method, "/v1/x?a=1", [("X-Y", "z")], body))
                except h1.RequestFailed as exc:
                    out.append(exc)
        finally:
            await pool.aclose()
        return out

    return go()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello"


def test_a_content_length_body_and_the_request_as_written() -> None:
    server: Scripted | None = None

    def go(s: Scripted) -> Any:
        nonlocal server
        server = s
        return exchange(s, ("POST", b"amount=1"))

    (got,) = run(answering(OK), go)
    assert got == h1.Response(200, (("Content-Length", "5"), ("X-A", "b")), b"hello")
    assert server is not None
    assert server.heads[0] == (
        b"POST /v1/x?a=1 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nX-Y: z\r\nContent-Length: 8\r\n\r\n"
        % server.port
    )


def test_a_chunked_body_is_decoded_and_transfer_encoding_dropped() -> None:
    chunked = (
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nX-A: b\r\n\r\n"
        b"4;ext=1\r\nwiki\r\n5\r\npedia\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    got = run(answering(chunked, OK), lambda s: exchange(s, ("POST", b"x"), ("POST", b"y")))
    assert got[0] == h1.Response(201, (("X-A", "b"),), b"wikipedia")
    assert got[1].body == b"hello"  # the connection stayed in step


def test_informational_answers_are_skipped_and_head_has_no_body() -> None:
    early = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\n" + OK
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"
    got = run(
        answering(early, head, OK),
        lambda s: exchange(s, ("POST", b""), ("HEAD", b""), ("GET", b"")),
    )
    assert [(r.status, r.body) for r in got] == [(200, b"hello"), (200, b""), (200, b"hello")]


def test_keep_alive_connections_are_reused() -> None:
    async def go(s: Scripted) -> int:
        got = await exchange(s, ("POST", b"1"), ("POST", b"2"), ("GET", b""))
        assert [r.status for r in got] == [200, 200, 200]
        return s.connections

    assert run(answering(OK, OK, OK), go) == 1


@pytest.mark.parametrize(
    "response",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\n\r\nhello",  # read to EOF
    ],
)
def test_a_connection_that_may_not_be_reused_is_not(response: bytes) -> None:
    async def go(s: Scripted) -> int:
        got = await exchange(s, ("POST", b"1"), ("POST", b"2"))
        assert [(r.status, r.body) for r in got] == [(200, b"hello")] * 2
        return s.connections

    assert run(answering(response, then_close=True), go) == 2


def test_an_idle_connection_the_server_closed_is_replaced_not_failed() -> None:
    async def go(s: Scripted) -> list[Any]:
        pool = s.pool()
        first = await pool.request("POST", "/", [], b"1")
        await asyncio.sleep(0.05)  # the server's FIN arrives while the connection is idle
        second = await pool.request("POST", "/", [], b"2")
        await pool.aclose()
        return [first.status, second.status, s.connections]

    assert run(answering(OK, then_close=True), go) == [200, 200, 2]


def test_a_reused_connection_dropped_after_the_write_is_sent_no_status() -> None:
    def make(server: Scripted) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(OK)
            await server.read_request(reader)  # got the second request, then goes away

        return handler

    got = run(make, lambda s: exchange(s, ("POST", b"1"), ("POST", b"2")))
    assert got[0].status == 200
    assert isinstance(got[1], h1.RequestFailed) and got[1].transport is Transport.SENT_NO_STATUS
    assert "reused connection" in got[1].line


def test_a_body_cut_after_the_status_line_keeps_the_status() -> None:
    cut = b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"id": "re_'
    (got,) = run(answering(cut, then_close=True), lambda s: exchange(s, ("POST", b"1")))
    assert got.status == 200 and got.body == b""
    # A line for people, not a raw IncompleteReadError: it reaches the agent's message.
    assert got.error == "the connection closed after 11 of 100 body bytes"


@pytest.mark.parametrize(
    ("response", "line"),
    [
        (b"", "the connection closed before a status line arrived"),
        (b"HTTP/1.1 20", "the connection closed inside the status line"),
        (b"HTTP/1.1 200 OK\r\nContent-Le", "the connection closed inside the response headers"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc",
            "the connection closed after 3 of 16 bytes of a chunk",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
            "the connection closed inside the chunked body",
        ),
    ],
)
def test_a_connection_closed_mid_answer_says_how_far_it_got(response: bytes, line: str) -> None:
    (got,) = run(answering(response, then_close=True), lambda s: exchange(s, ("POST", b"1")))
    text = got.line if isinstance(got, h1.RequestFailed) else got.error
    assert text == line
    if isinstance(got, h1.RequestFailed):
        assert got.transport is Transport.SENT_NO_STATUS  # the request had been written


def test_a_body_that_outlives_the_deadline_keeps_the_status() -> None:
    slow = b"HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\n{"
    (got,) = run(answering(slow), lambda s: exchange(s, ("POST", b"1"), timeout=0.3))
    assert got.status == 201 and "TimeoutError" in (got.error or "")


@pytest.mark.parametrize(
    "garbage", [b"HTTP/1.1 2000 OK\r\n\r\n", b"SSH-2.0-x\r\n", b"HTTP/1.1 200 OK"]
)
def test_no_status_line_after_the_write_is_sent_no_status(garbage: bytes) -> None:
    (got,) = run(answering(garbage, then_close=True), lambda s: exchange(s, ("POST", b"1")))
    assert isinstance(got, h1.RequestFailed) and got.transport is Transport.SENT_NO_STATUS


@pytest.mark.parametrize(
    ("method", "target", "headers"),
    [
        ("POST", "/", [("X", "a\r\nX-Evil: 1")]),  # a line break in a header
        ("POST", "/v1/refunds\tHTTP/1.1", []),  # what came over HTTP/2 may hold a tab
        ("POST\t/x", "/", []),
        ("POST", "/a\x00b", []),
        ("POST", "/", [("X", "a\x00b")]),  # a server may cut the value at the NUL
        ("POST", "/", [("X", "a\x0bb")]),
        ("POST", "/", [("X", "a\x7fb")]),
        ("POST", "/", [("a:b", "c")]),  # read as the header "a"
        ("POST", "/", [("a b", "c")]),
        ("POST", "/", [("", "c")]),
    ],
)
def test_what_http_1_1_forbids_in_a_head_is_refused_before_anything_is_sent(
    method: str, target: str, headers: list[tuple[str, str]]
) -> None:
    async def go(s: Scripted) -> Any:
        pool = s.pool()
        with pytest.raises(h1.RequestFailed) as caught:
            await pool.request(method, target, headers, b"")
        return caught.value.transport, s.connections

    assert run(answering(OK), go) == (Transport.NOT_SENT, 0)


def test_a_tab_inside_a_header_value_is_sent_as_it_is() -> None:
    async def go(s: Scripted) -> Any:
        pool = s.pool()
        try:
            return (await pool.request("POST", "/", [("X", "a\tb")], b"")).status
        finally:
            await pool.aclose()

    assert run(answering(OK), go) == 200


# -- nothing sent ------------------------------------------------------------------------------


@pytest.fixture
def closed_port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, never listening: connecting is refused, and held
    yield sock.getsockname()[1]  # so that nothing else takes the port meanwhile
    sock.close()


def failure(pool: h1.Pool) -> h1.RequestFailed:
    async def go() -> h1.RequestFailed:
        try:
            with pytest.raises(h1.RequestFailed) as caught:
                await pool.request("POST", "/v1/refunds", AUTH, REFUND)
            return caught.value
        finally:
            await pool.aclose()

    return asyncio.run(go())


def test_connection_refused_is_not_sent(closed_port: int) -> None:
    got = failure(h1.Pool("http", "127.0.0.1", closed_port, timeout=5))
    assert got.transport is Transport.NOT_SENT
    assert got.line.startswith("ConnectError: ConnectionRefusedError")


@pytest.mark.parametrize(
    "error", [socket.gaierror(-2, "Name or service not known"), TimeoutError()]
)
def test_dns_failure_and_connect_timeout_are_not_sent(
    error: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def connect(*args: Any, **kw: Any) -> Any:
        # No name is resolved off the machine: the failure is raised where the resolver would.
        raise error

    monkeypatch.setattr(h1.asyncio, "open_connection", connect)
    got = failure(h1.Pool("http", "api.example.invalid", 80, timeout=5))
    assert got.transport is Transport.NOT_SENT


def test_a_connect_that_hangs_is_cut_by_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def connect(*args: Any, **kw: Any) -> Any:
        await asyncio.sleep(30)

    monkeypatch.setattr(h1.asyncio, "open_connection", connect)
    started = time.monotonic()
    got = failure(h1.Pool("http", "127.0.0.1", 1, timeout=5, connect_timeout=0.2))
    assert got.transport is Transport.NOT_SENT and time.monotonic() - started < 2


def test_a_tls_handshake_with_a_plain_server_is_not_sent() -> None:
    async def go(s: Scripted) -> h1.RequestFailed:
        pool = h1.Pool("https", "127.0.0.1", s.port, timeout=5)
        with pytest.raises(h1.RequestFailed) as caught:
            await pool.request("POST", "/v1/refunds", AUTH, REFUND)
        return caught.value

    async def plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)  # the ClientHello, answered as a plain server would
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    got = run(lambda s: plain, go)
    assert got.transport is Transport.NOT_SENT and "SSL" in got.line


def test_a_tls_handshake_that_never_finishes_is_not_sent() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        port = silent.getsockname()[1]
        got = failure(h1.Pool("https", "127.0.0.1", port, timeout=0.3))
        assert got.transport is Transport.NOT_SENT and "TimeoutError" in got.line


def test_an_untrusted_certificate_is_not_sent() -> None:
    with FakeStripe(tls=True) as stripe:
        got = failure(h1.Pool("https", "127.0.0.1", stripe.port, timeout=5))
        assert got.transport is Transport.NOT_SENT and "CERTIFICATE_VERIFY_FAILED" in got.line
        assert stripe.count() == 0


# -- against the fake remote, through the Forwarder --------------------------------------------


def upstream(fake: FakeStripe, timeout: float = 5.0) -> Upstream:
    scheme = "https" if fake.tls else "http"
    return Upstream(
        name="s",
        profile="stripe",
        url=fake.url,
        scheme=scheme,
        host="127.0.0.1",
        port=fake.port,
        timeout=timeout,
        ca_file=fake.ca_file,
    )


def forward(fake: FakeStripe, *, times: int = 1, timeout: float = 5.0) -> list[Any]:
    up = upstream(fake, timeout)

    async def go() -> list[Any]:
        fwd = Forwarder([up])
        try:
            return [await fwd.send(up, "POST", "/v1/refunds", AUTH, REFUND) for _ in range(times)]
        finally:
            await fwd.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize("tls", [False, True])
def test_the_forwarder_answers_from_the_fake_over_one_connection(tls: bool) -> None:
    with FakeStripe(tls=tls) as stripe:
        stripe.add_payment_intent("pi_1", amount=1000)
        replies = forward(stripe, times=3)
        assert [r.status for r in replies] == [200, 200, 200]
        refund = json.loads(replies[0].body)
        assert (refund["object"], refund["payment_intent"], refund["amount"]) == (
            "refund",
            "pi_1",
            100,
        )
        assert not any(k.lower() in h1.HOP_BY_HOP for k, _ in replies[0].headers)
        assert stripe.writes_applied == 3


@pytest.mark.parametrize("mode", ["reset_before", "commit_then_drop"])
def test_a_request_dropped_after_sending_is_sent_no_status(mode: Any) -> None:
    with FakeStripe() as stripe:
        stripe.add_payment_intent("pi_1", amount=1000)
        stripe.fail_next(mode)
        (reply,) = forward(stripe)
        assert reply.status is None and reply.transport is Transport.SENT_NO_STATUS


def test_a_hang_past_the_deadline_is_sent_no_status_within_the_deadline() -> None:
    with FakeStripe(hang_seconds=10) as stripe:
        stripe.add_payment_intent("pi_1", amount=1000)
        stripe.fail_next("hang")
        started = time.monotonic()
        (reply,) = forward(stripe, timeout=0.5)
        assert reply.transport is Transport.SENT_NO_STATUS and "TimeoutError" in reply.error
        assert 0.4 < time.monotonic() - started < 2


def test_an_injected_status_decides() -> None:
    with FakeStripe() as stripe:
        stripe.fail_next(503)
        (reply,) = forward(stripe)
        assert reply.status == 503 and reply.transport is None and not reply.cut_short


def test_ssl_context_is_used_for_verification() -> None:
    with FakeStripe(tls=True) as stripe:
        assert stripe.ca_file is not None
        context = ssl.create_default_context(cafile=stripe.ca_file)
        pool = h1.Pool("https", "127.0.0.1", stripe.port, timeout=5, ssl_context=context)

        async def go() -> int:
            try:
                return (await pool.request("GET", "/v1/refunds", AUTH, b"")).status
            finally:
                await pool.aclose()

        assert asyncio.run(go()) == 200
