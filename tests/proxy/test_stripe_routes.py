"""The Stripe route table's own rules: identity-bearing headers, connected accounts, the
legacy refund endpoints and the payment a refund names."""

from __future__ import annotations

import pytest

from ctrlrun.proxy.config import Upstream
from ctrlrun.proxy.routes import Invalid, Mapped, Request, map_request

STRIPE = Upstream(
    name="stripe",
    profile="stripe",
    url="https://api.stripe.com",
    scheme="https",
    host="api.stripe.com",
    port=443,
)
FORM = {"content-type": "application/x-www-form-urlencoded"}
BODY = b"payment_intent=pi_1&amount=100"


def refund(headers: dict[str, str], repeated: frozenset[str] = frozenset()) -> Request:
    return Request("POST", "/v1/refunds", {}, FORM | headers, BODY, repeated)


@pytest.mark.parametrize(
    "name",
    ["idempotency-key", "stripe-account", "authorization", "stripe-version", "stripe-context"],
)
def test_an_identity_header_sent_twice_is_refused(name: str) -> None:
    got = map_request(STRIPE, refund({name: "x"}, frozenset({name})))
    assert isinstance(got, Invalid) and f"the header {name} is sent more than once" in got.reason


def test_other_repeated_headers_are_fine() -> None:
    got = map_request(STRIPE, refund({"accept": "x"}, frozenset({"accept"})))
    assert isinstance(got, Mapped)


@pytest.mark.parametrize("name", ["idempotency_key", "stripe_account", "stripe_version"])
def test_an_underscore_spelling_of_an_identity_header_is_refused(name: str) -> None:
    got = map_request(STRIPE, refund({name: "k2"}))
    assert isinstance(got, Invalid) and "would be read as" in got.reason


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_idempotency_key_is_refused(value: str) -> None:
    got = map_request(STRIPE, refund({"idempotency-key": value}))
    assert isinstance(got, Invalid) and "Idempotency-Key header is empty" in got.reason
