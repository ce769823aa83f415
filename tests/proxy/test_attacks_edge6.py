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
from ctrlrun.proxy.config import Upstream
from ctrlrun.proxy.recognize import Recognizer
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
