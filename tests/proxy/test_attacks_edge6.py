"""Which tunnels are intercepted once what the recogniser remembers has run out.

A CONNECT is judged when it arrives; whether its tunnel is intercepted is decided later, when
the agent's first bytes arrive, from what the recogniser still knows without waiting. A name
seen to reach an upstream is learned, but only up to ``MAX_CACHED`` names; past that it was
known only while its lookup was fresh. An agent that had filled the table (a read to each of
4,096 spellings of the upstream: ``127.0.0.2``, ``127.0.0.3``...) and waited out the lookup
after its CONNECT to ``localhost`` had its tunnel relayed raw: a denied write went straight
to the upstream. A tunnel's host whose lookup has expired is now intercepted, so its requests
meet the gate, which resolves it again.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_recognize import Clock, Resolver
from test_tunnels import context

from ctrlrun.proxy import recognize
from ctrlrun.proxy.config import Route, Upstream
from ctrlrun.proxy.recognize import Recognizer
from ctrlrun.proxy.routes import Invalid, Mapped, Request, Unmapped, map_request
from ctrlrun.proxy.tunnels import GuardedNextLayer

UP = Upstream("billing", "http", "http://127.0.0.1:8088", "http", "127.0.0.1", 8088)
DNS = {
    "localhost": ("127.0.0.1",),
    "alias.example": ("127.0.0.1",),
    "other.example": ("192.0.2.7",),
}
WRITE = b"POST /v1/invoices/in_1/send HTTP/1.1\r\nHost: localhost:8088\r\nContent-Length: 0\r\n\r\n"


def full(monkeypatch: pytest.MonkeyPatch) -> tuple[GuardedNextLayer, Clock]:
    """A rule over a recogniser whose table of learned names is already full."""
    monkeypatch.setattr(recognize, "MAX_CACHED", 2)
    clock = Clock()
    rec = Recognizer([UP], resolve=Resolver(DNS), clock=clock, ttl=30.0, environ={})

    async def fill() -> None:
        for host in ("127.0.0.2", "127.0.0.3"):
            assert (await rec.destination(host, 8088)).upstream is UP

    asyncio.run(fill())
    return GuardedNextLayer(rec), clock


@pytest.mark.parametrize("name", ["localhost", "alias.example", "LOCALHOST."])
def test_a_tunnel_to_a_name_of_the_upstream_is_intercepted_after_its_lookup_expired(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    rule, clock = full(monkeypatch)
    got = asyncio.run(rule.recognizer.destination(name, 8088))  # the CONNECT, judged
    assert got.upstream is UP
    assert rule._ignore_connection(context((name, 8088)), WRITE, b"") is False
    clock.now += 31  # the agent waits before it sends anything into the tunnel
    assert rule._ignore_connection(context((name, 8088)), WRITE, b"") is False
    assert rule._ignore_connection(context((name, 8088)), b"\x16\x03\x01", b"") is False


def test_a_pass_through_tunnel_pinned_to_its_address_is_still_untouched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rule, clock = full(monkeypatch)
    got = asyncio.run(rule.recognizer.destination("other.example", 8088))
    assert got.upstream is None and got.dial == "192.0.2.7"
    clock.now += 31
    other = b"GET / HTTP/1.1\r\nHost: other.example:8088\r\n\r\n"
    assert rule._ignore_connection(context(("192.0.2.7", 8088)), other, b"") is True
    # The same pinned tunnel whose request names the upstream is intercepted (and refused).
    named = b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8088\r\n\r\n"
    assert rule._ignore_connection(context(("192.0.2.7", 8088)), named, b"") is False


# -- an upstream whose DNS keeps moving --------------------------------------------------
# Every address an upstream resolved to was remembered, up to 256; past that, new ones were
# not: a sidecar in front of a load-balanced API whose addresses rotate took the address the
# upstream's name resolved to at that moment for another server, so a write to it went
# through unguarded. The newest addresses are kept now, the oldest forgotten.

NAMED = Upstream("stripe", "stripe", "https://api.stripe.com", "https", "api.stripe.com", 443)


class Rotating:
    """api.stripe.com at a new address on every lookup."""

    def __init__(self) -> None:
        self.turn = 0

    def address(self, turn: int) -> str:
        return f"54.187.{turn // 250}.{turn % 250 + 1}"

    async def __call__(self, name: str) -> tuple[str, ...]:
        if name != "api.stripe.com":
            raise OSError(f"{name}: no such host")
        return (self.address(self.turn),)


def test_what_a_rotating_upstream_resolves_to_now_is_always_that_upstream() -> None:
    resolver, clock = Rotating(), Clock()
    rec = Recognizer([NAMED], resolve=resolver, clock=clock, ttl=30.0, environ={})

    async def rotate() -> None:
        for turn in range(recognize.MAX_ADDRESSES + 50):
            resolver.turn = turn
            clock.now += 31  # its lookup expired: the name is asked again
            got = await rec.destination(resolver.address(turn), 443)
            assert got.upstream is NAMED, turn
        # A recent address still is; the oldest are forgotten (at most MAX_ADDRESSES kept).
        assert (await rec.destination(resolver.address(turn - 10), 443)).upstream is NAMED
        clock.now += 31
        assert (await rec.destination(resolver.address(0), 443)).upstream is None

    asyncio.run(rotate())


def test_an_upstreams_own_literal_address_is_never_forgotten() -> None:
    resolver, clock = Rotating(), Clock()
    rec = Recognizer([NAMED, UP], resolve=resolver, clock=clock, ttl=30.0, environ={})

    async def rotate() -> None:
        for turn in range(recognize.MAX_ADDRESSES + 5):
            resolver.turn = turn
            clock.now += 31
            await rec.refresh()
        assert (await rec.destination("127.0.0.1", 8088)).upstream is UP
        assert (await rec.destination("127.1", 8088)).upstream is UP

    asyncio.run(rotate())


# -- a path a server behind a decoding proxy reads as a route ----------------------------
# Under ``unmapped_writes: allow`` a write no route maps is forwarded, recorded as unmapped.
# A proxy in front of the remote that decodes the path before passing it on (nginx with a
# URI in proxy_pass or $uri, IIS's double decoding) makes '%2573end' 'send' and 'send%3Fx'
# 'send?x', the route with a query; a server folding Unicode reads 'ｓend' as 'send'. Each
# was forwarded undecided as an unmapped write. A path holding an encoded '%', '?' or '#' is
# refused now (a route's parameter too: 'in_%2531' is in_1 there, a fresh effect key here),
# and one that is a route's once Unicode is folded is refused as a route's near spelling.

OPEN = Upstream(
    "billing",
    "http",
    "http://b:80",
    "http",
    "b",
    80,
    routes=(Route("POST", "/v1/invoices/{invoice}/send", "billing.send"),),
    unmapped_writes="allow",
)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/invoices/in_1/%2573end",  # decoded twice
        "/v1/invoices/in_1/send%3Fx=1",  # decoded, then the query cut off
        "/v1/invoices/in_1/send%3F",
        "/v1/invoices/in_1/send%23x",
        "/v1/invoices/in_1/send%253Bx",
        "/v1/%2569nvoices/in_1/send",
        "/v1/invoices/in_1/%EF%BD%93end",  # full-width s: NFKC folds it
        "/v1/invoices/in_1/send%C2%A0",  # a no-break space
        "/v1/invoices/in_1/send+",  # '+' decoded as a space, then trimmed
    ],
)
def test_a_path_a_server_decodes_again_into_a_route_is_refused_not_unmapped(path: str) -> None:
    result = map_request(OPEN, Request("POST", path))
    reasons = ("may read it as that route", "ambiguous")
    assert isinstance(result, Invalid) and any(r in result.reason for r in reasons), result


@pytest.mark.parametrize(
    "path",
    [
        "/v1/invoices/in_1/sent",
        "/v1/invoices/in_1/send%2Bx",  # 'send+x': another word, even decoded again
        "/v1/invoices/in_1/send/more",
    ],
)
def test_other_paths_stay_unmapped(path: str) -> None:
    assert isinstance(map_request(OPEN, Request("POST", path)), Unmapped), path
    assert isinstance(map_request(OPEN, Request("POST", "/v1/invoices/in_1/send")), Mapped)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/invoices/in_%2531/send",  # in_1 to a server that decodes twice: a fresh key here
        "/v1/invoices/in_1%3F/send",  # POST /v1/invoices/in_1 with a query, decoded again
        "/v1/invoices/in_1%23/send",
        "/v1/invoices/a%252Fb/send",
    ],
)
def test_a_route_parameter_a_second_decoding_reads_otherwise_is_refused(path: str) -> None:
    result = map_request(OPEN, Request("POST", path))
    assert isinstance(result, Invalid) and "ambiguous" in result.reason, result


# -- a request line in absolute-form names where it goes ---------------------------------


@pytest.mark.parametrize(
    "line",
    [
        b"POST http://127.0.0.1:8088/v1/invoices/in_1/send HTTP/1.1\r\n",
        b"POST http://user:pw@localhost.:8088/v1/x HTTP/1.1\r\n",
        b"\r\nPOST HTTP://127.1:8088?a HTTP/1.1\r\n",
        b"post http://[::ffff:127.0.0.1]:8088/ HTTP/1.1\r\n",
    ],
)
def test_a_tunnel_whose_request_line_names_the_upstream_is_intercepted(line: bytes) -> None:
    rec = Recognizer([UP], resolve=Resolver(DNS), clock=Clock(), environ={})
    asyncio.run(rec.destination("localhost", 8088))  # resolved, as the gate would have
    rule = GuardedNextLayer(rec)
    data = line + b"Host: other.example\r\nContent-Length: 0\r\n\r\n"
    assert rule._ignore_connection(context(("192.0.2.7", 80)), data, b"") is False
    other = b"POST http://other.example/v1/x HTTP/1.1\r\nHost: other.example\r\n\r\n"
    assert rule._ignore_connection(context(("192.0.2.7", 80)), other, b"") is True
