"""The forwarder says exactly how far a request got (the classification depends on it)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from ctrlrun.proxy.classify import Transport
from ctrlrun.proxy.forward import Forwarder, forward_headers
from ctrlrun.upstreams import Upstream

UP = Upstream(
    name="s",
    profile="stripe",
    url="http://api.example.test",
    scheme="http",
    host="api.example.test",
    port=80,
    timeout=5.0,
)


def send_through(transport: httpx.AsyncBaseTransport):  # type: ignore[no-untyped-def]
    async def go():  # type: ignore[no-untyped-def]
        fwd = Forwarder([UP], transport=transport)
        try:
            return await fwd.send(UP, "POST", "/v1/refunds", [], b"amount=1")
        finally:
            await fwd.aclose()

    return asyncio.run(go())


def raising(exc: Exception) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return httpx.MockTransport(handler)


@pytest.mark.parametrize(
    ("exc", "transport"),
    [
        (httpx.ConnectError("[Errno -2] Name or service not known"), Transport.NOT_SENT),  # DNS
        (httpx.ConnectError("[Errno 111] Connection refused"), Transport.NOT_SENT),
        (httpx.ConnectTimeout("timed out"), Transport.NOT_SENT),
        (httpx.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED]"), Transport.NOT_SENT),
        (httpx.WriteError("broken pipe"), Transport.SENT_NO_STATUS),
        (httpx.ReadTimeout("timed out"), Transport.SENT_NO_STATUS),
        (httpx.RemoteProtocolError("Server disconnected"), Transport.SENT_NO_STATUS),
        (httpx.ReadError("connection reset"), Transport.SENT_NO_STATUS),
    ],
)
def test_transport_failures_say_whether_anything_was_sent(
    exc: Exception, transport: Transport
) -> None:
    reply = send_through(raising(exc))
    assert reply.status is None and reply.transport is transport
    assert reply.error and type(exc).__name__ in reply.error


def test_a_status_line_decides_even_when_the_body_is_cut() -> None:
    class CutBody(httpx.AsyncByteStream):
        async def __aiter__(self):  # type: ignore[no-untyped-def,override]
            yield b'{"id": "re_'
            raise httpx.ReadError("connection reset mid-body")

    reply = send_through(httpx.MockTransport(lambda r: httpx.Response(200, stream=CutBody())))
    assert reply.status == 200 and reply.cut_short and reply.transport is None


def test_ctrlrun_and_hop_by_hop_headers_are_never_forwarded() -> None:
    headers = [
        ("Ctrlrun-Approval", "apr_1"),
        ("Proxy-Authorization", "Basic x"),
        ("Connection", "keep-alive"),
        ("Idempotency-Key", "k"),
        ("Authorization", "B"),
    ]
    assert forward_headers(headers) == [("Idempotency-Key", "k"), ("Authorization", "B")]
