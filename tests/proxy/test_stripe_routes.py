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


# -- the account is an argument of every Stripe action -------------------------------------------

WRITES = [
    Request("POST", "/v1/refunds", {}, FORM, BODY),
    Request("POST", "/v1/payouts", {}, FORM, b"amount=100&currency=usd"),
    Request("POST", "/v1/charges", {}, FORM, b"amount=100&currency=usd"),
    Request("POST", "/v1/payment_intents/pi_1/cancel", {}, FORM, b""),
    Request("DELETE", "/v1/customers/cus_1", {}, {}, b""),
]


@pytest.mark.parametrize("write", WRITES)
@pytest.mark.parametrize(
    ("header", "account"), [(None, "self"), ("acct_1Abc", "acct_1Abc"), (" acct_2 ", "acct_2")]
)
def test_every_stripe_action_names_its_account(
    write: Request, header: str | None, account: str
) -> None:
    headers = dict(write.headers) | ({"stripe-account": header} if header is not None else {})
    got = map_request(STRIPE, Request(write.method, write.path, {}, headers, write.body))
    assert isinstance(got, Mapped) and got.arguments["account"] == account


@pytest.mark.parametrize(
    "value", ["", "acct_", "ACCT_1", "acct_1;acct_2", "acct_1 acct_2", "cus_1", "acct_" + "a" * 65]
)
def test_a_stripe_account_that_is_not_an_account_id_is_refused(value: str) -> None:
    got = map_request(STRIPE, refund({"stripe-account": value}))
    assert isinstance(got, Invalid) and "is not an account id" in got.reason


def test_stripe_context_is_refused() -> None:
    got = map_request(STRIPE, refund({"stripe-context": "ctx_1"}))
    assert isinstance(got, Invalid) and "Stripe-Context" in got.reason


@pytest.mark.parametrize("field", ["account=acct_9", "payment_id=pi_9"])
def test_a_body_cannot_choose_what_ctrlrun_derives(field: str) -> None:
    got = map_request(
        STRIPE, Request("POST", "/v1/payouts", {}, FORM, f"amount=1&{field}".encode())
    )
    assert isinstance(got, Invalid) and "ctrlrun derives it" in got.reason
