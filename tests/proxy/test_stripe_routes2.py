"""How a Stripe request is read from a mitmproxy flow, where the proxy's reading and a
server's could part: a '#' in the target."""

from __future__ import annotations

import pytest
from mitmproxy import http
from mitmproxy.test import tflow

from ctrlrun.proxy.addon import _is_read, facts
from ctrlrun.proxy.config import Upstream
from ctrlrun.proxy.routes import Invalid, Mapped, map_request

STRIPE = Upstream("stripe", "stripe", "https://api.stripe.com", "https", "api.stripe.com", 443)
FORM = "application/x-www-form-urlencoded"


def flow(method: str, target: str, body: bytes = b"") -> http.HTTPFlow:
    f = tflow.tflow()
    f.request.method = method
    f.request.path = target
    f.request.headers["content-type"] = FORM
    f.request.raw_content = body
    return f


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("POST", "/v1/refunds?metadata[n]=#&amount=900000"),
        ("POST", "/v1/refunds?amount=1#"),
        ("POST", "/v1/refunds#?amount=900000"),
        ("DELETE", "/v1/customers/cus_1#x"),
        # A read whose override only a server reading past the '#' would see.
        ("GET", "/v1/customers/cus_1?x=#&_method=DELETE"),
    ],
)
def test_a_target_with_a_fragment_is_refused(method: str, target: str) -> None:
    body = b"payment_intent=pi_1&amount=1" if method == "POST" else b""
    f = flow(method, target, body)
    assert not _is_read(f.request)
    got = map_request(STRIPE, facts(f))
    assert isinstance(got, Invalid) and "'#'" in got.reason, got


def test_an_encoded_hash_is_a_value_like_any_other() -> None:
    got = map_request(STRIPE, facts(flow("POST", "/v1/refunds?metadata[n]=%23", b"amount=1")))
    assert isinstance(got, Mapped) and got.arguments["metadata"] == {"n": "#"}, got
