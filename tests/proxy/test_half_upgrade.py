"""``Connection: upgrade`` without an ``Upgrade`` header, to a guarded remote: Go's apiserver
takes the first alone for an upgrade (``httpstream.IsUpgradeRequest``), so such a GET to
``pods/exec`` is neither the read it looks like nor a write ctrlrun could decide."""

from __future__ import annotations

import pytest
from mitmproxy.test import tutils

from ctrlrun.proxy.addon import _is_read
from ctrlrun.proxy.config import Upstream
from ctrlrun.proxy.routes import Invalid, PassThrough, Request, map_request

KUBE = Upstream("k", "kubernetes", "https://k:6443", "https", "k", 6443, cluster="c")
STRIPE = Upstream("stripe", "stripe", "https://api.stripe.com", "https", "api.stripe.com", 443)
EXEC = "/api/v1/namespaces/default/pods/web-0/exec"


@pytest.mark.parametrize("value", ["Upgrade", "keep-alive, upgrade", "UPGRADE", " Upgrade "])
@pytest.mark.parametrize("upstream", [KUBE, STRIPE])
def test_a_read_saying_connection_upgrade_alone_is_refused(upstream: Upstream, value: str) -> None:
    got = map_request(upstream, Request("GET", EXEC, {"command": ["sh"]}, {"connection": value}))
    assert isinstance(got, Invalid) and "Connection: upgrade" in got.reason, got


def test_connection_headers_sent_twice_are_refused_one_may_say_upgrade() -> None:
    request = Request(
        "GET", EXEC, headers={"connection": "keep-alive"}, repeated=frozenset({"connection"})
    )
    got = map_request(KUBE, request)
    assert isinstance(got, Invalid) and "more than one Connection" in got.reason, got


def test_a_plain_keep_alive_read_still_passes() -> None:
    got = map_request(KUBE, Request("GET", "/api/v1/pods", headers={"connection": "keep-alive"}))
    assert isinstance(got, PassThrough), got


@pytest.mark.parametrize(
    ("fields", "read"),
    [
        ([(b"Connection", b"keep-alive")], True),
        ([(b"Connection", b"Upgrade")], False),
        ([(b"connection", b"close, UPGRADE")], False),
        ([(b"Connection", b"keep-alive"), (b"Connection", b"upgrade")], False),
    ],
)
def test_the_fast_read_check_sends_connection_upgrade_to_the_guard(
    fields: list[tuple[bytes, bytes]], read: bool
) -> None:
    req = tutils.treq(method=b"GET", path=EXEC.encode(), content=b"")
    req.headers.fields = tuple(fields)
    assert _is_read(req) is read
