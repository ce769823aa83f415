"""How a Stripe request is read from a mitmproxy flow, where the proxy's reading and a
server's could part: a '#' in the target, refunds made through other objects."""

from __future__ import annotations

import pytest
from mitmproxy import http
from mitmproxy.test import tflow

from ctrlrun.proxy.addon import _is_read, facts
from ctrlrun.proxy.config import Upstream
from ctrlrun.proxy.routes import Invalid, Mapped, Request, Unmapped, map_request

STRIPE = Upstream("stripe", "stripe", "https://api.stripe.com", "https", "api.stripe.com", 443)
OPEN = Upstream(
    "stripe",
    "stripe",
    "https://api.stripe.com",
    "https",
    "api.stripe.com",
    443,
    unmapped_writes="allow",
)
FORM = "application/x-www-form-urlencoded"


def flow(method: str, target: str, body: bytes = b"") -> http.HTTPFlow:
    f = tflow.tflow()
    f.request.method = method
    f.request.path = target
    f.request.headers["content-type"] = FORM
    f.request.raw_content = body
    f.request.headers["content-length"] = str(len(body))  # as on the wire (tflow's says 7)
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


def post(path: str, body: bytes, kind: str = FORM) -> Request:
    return Request("POST", path, {}, {"content-type": kind}, body)


@pytest.mark.parametrize(
    "request_",
    [
        post("/v1/credit_notes", b"invoice=in_1&refund_amount=900000"),
        post("/v1/credit_notes", b"invoice=in_1&amount=5&refund_amount=5&metadata[a]=b"),
        post("/v1/credit_notes", b"invoice=in_1", "application/json"),  # unreadable: may refund
        Request("POST", "/v1/credit_notes", {"refund_amount": ["5"]}, {}, b""),
        post("/v1/terminal/readers/tmr_1/refund_payment", b"payment_intent=pi_1"),
        post("/v1/terminal/readers/tmr_1/refund_payment/", b""),
    ],
)
def test_a_refund_through_another_object_is_refused(request_: Request) -> None:
    for upstream in (STRIPE, OPEN):
        got = map_request(upstream, request_)
        assert isinstance(got, Invalid), got


@pytest.mark.parametrize(
    "body", [b"invoice=in_1&credit_amount=5", b"invoice=in_1&refunds[0][refund]=re_1", b""]
)
def test_a_credit_note_that_makes_no_refund_is_unmapped(body: bytes) -> None:
    assert isinstance(map_request(OPEN, post("/v1/credit_notes", body)), Unmapped)


@pytest.mark.parametrize("path", ["/V1/Credit_Notes", "/v1/terminal/readers/tmr_1/REFUND_PAYMENT"])
def test_a_refund_road_spelt_loosely_is_refused(path: str) -> None:
    got = map_request(OPEN, post(path, b"invoice=in_1"))
    assert isinstance(got, Invalid) and "may read it as that route" in got.reason, got
