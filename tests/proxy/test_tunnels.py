"""Which connections mitmproxy intercepts: those that reach or name an upstream, by address."""

from __future__ import annotations

import pytest
from mitmproxy import connection, options
from mitmproxy.proxy.context import Context

from ctrlrun.proxy.config import Upstream
from ctrlrun.proxy.recognize import Recognizer
from ctrlrun.proxy.tunnels import GuardedNextLayer

UP = Upstream("kube", "kubernetes", "https://127.0.0.1:6443", "https", "127.0.0.1", 6443)
NAMED = Upstream("stripe", "stripe", "https://api.stripe.com", "https", "api.stripe.com", 443)


def context(address: tuple[str, int] | None) -> Context:
    client = connection.Client(
        peername=("127.0.0.1", 50000), sockname=("127.0.0.1", 8080), timestamp_start=0
    )
    ctx = Context(client, options.Options())
    ctx.server.address = address
    return ctx


@pytest.mark.parametrize(
    ("address", "data", "ignored"),
    [
        (None, b"", False),  # the proxy's own first layer
        (("127.0.0.1", 6443), b"", False),
        (("127.1", 6443), b"", False),
        (("2130706433", 6443), b"", False),
        (("[::1]", 6443), b"", False),
        (("::ffff:127.0.0.1", 6443), b"", False),
        (("api.stripe.com", 443), b"", False),
        (("127.0.0.1", 6444), b"", True),  # another port: another server, tunnelled untouched
        (("192.0.2.1", 443), b"", True),
        # Plain HTTP naming an upstream in its Host, sent elsewhere: read, so it is refused.
        (("192.0.2.1", 443), b"GET / HTTP/1.1\r\nHost: api.stripe.com\r\n\r\n", False),
        (("192.0.2.1", 443), b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n", True),
    ],
)
def test_a_connection_is_intercepted_when_it_reaches_or_names_an_upstream(
    address: tuple[str, int] | None, data: bytes, ignored: bool
) -> None:
    rule = GuardedNextLayer(Recognizer([UP, NAMED], environ={}))
    assert bool(rule._ignore_connection(context(address), data, b"")) is ignored
