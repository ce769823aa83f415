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


# -- every path that refunds a payment maps to stripe.refund -------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "arguments"),
    [
        ("/v1/refunds", b"payment_intent=pi_1&amount=5", {"payment_intent": "pi_1", "amount": 5}),
        ("/v1/refunds", b"charge=ch_1&amount=5", {"charge": "ch_1", "amount": 5}),
        ("/v1/charges/ch_1/refund", b"amount=5", {"charge": "ch_1", "amount": 5}),
        ("/v1/charges/ch_1/refunds", b"amount=5", {"charge": "ch_1", "amount": 5}),
        ("/v1/charges/ch_1/refunds", b"charge=ch_1", {"charge": "ch_1"}),
        ("/v1/charges/ch_1/refund", b"", {"charge": "ch_1"}),
        ("/v1/charges/py_1/refund/", b"", {"charge": "py_1"}),
    ],
)
def test_every_refund_path_is_stripe_refund(
    path: str, body: bytes, arguments: dict[str, object]
) -> None:
    got = map_request(STRIPE, Request("POST", path, {}, FORM, body))
    payment = arguments.get("payment_intent", arguments.get("charge"))
    assert got == Mapped("stripe.refund", arguments | {"account": "self", "payment_id": payment})


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/refunds", b"charge=ch_1&payment_intent=pi_1"),
        ("/v1/charges/ch_1/refund", b"payment_intent=pi_2"),
        ("/v1/charges/ch_1/refunds", b"charge=ch_2"),
        ("/v1/charges/ch_1/refund?charge=ch_2", b""),
    ],
)
def test_a_refund_naming_two_payments_is_refused(path: str, body: bytes) -> None:
    target, _, query = path.partition("?")
    params = {k: [v] for k, v in (p.split("=") for p in query.split("&") if p)}
    assert isinstance(map_request(STRIPE, Request("POST", target, params, FORM, body)), Invalid)
