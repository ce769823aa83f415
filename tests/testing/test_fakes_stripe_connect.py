"""The fake Stripe's connected accounts, charges and their payment intents, the legacy refund
endpoints, and what its idempotency layer stores (nothing for 401, 429 or an unknown
account), driven with httpx and the official stripe client."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator

import httpx
import pytest
import stripe

from ctrlrun.testing import FakeStripe

KEY = "sk_test_connect123"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def fake() -> Iterator[FakeStripe]:
    with FakeStripe(hang_seconds=0.5) as server:
        yield server


@pytest.fixture
def http(fake: FakeStripe) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake.url, headers=AUTH, timeout=5, trust_env=False) as client:
        yield client


def sdk(fake: FakeStripe, key: str = KEY) -> stripe.StripeClient:
    return stripe.StripeClient(key, base_addresses={"api": fake.url}, max_network_retries=0)


# -- Stripe-Account ------------------------------------------------------------------------------


def test_a_connected_account_holds_its_own_objects(fake: FakeStripe) -> None:
    acct = fake.add_account("acct_A1")
    pi = fake.add_payment_intent(amount=3000, account=acct)["id"]
    client = sdk(fake)

    done = client.v1.refunds.create(
        params={"payment_intent": pi, "amount": 100}, options={"stripe_account": acct}
    )

    assert done.amount == 100 and [r["id"] for r in fake.refunds_in(acct)] == [done.id]
    assert fake.refunds == []  # the platform's own account has none
    with pytest.raises(stripe.InvalidRequestError) as missing:
        client.v1.refunds.create(params={"payment_intent": pi, "amount": 100})
    assert missing.value.http_status == 404  # the platform has no such payment intent


def test_an_unknown_account_is_refused_and_stores_nothing(
    fake: FakeStripe, http: httpx.Client
) -> None:
    acct = fake.add_account()
    pi = fake.add_payment_intent(amount=3000, account=acct)["id"]
    form = {"payment_intent": pi, "amount": "100"}
    headers = {"Idempotency-Key": "k-unknown", "Stripe-Account": "acct_nobody"}

    refused = http.post("/v1/refunds", data=form, headers=headers)

    assert refused.status_code == 403 and refused.json()["error"]["code"] == "account_invalid"
    # The same key on the right account runs: nothing was stored under it.
    done = http.post("/v1/refunds", data=form, headers=headers | {"Stripe-Account": acct})
    assert done.status_code == 200 and "Idempotent-Replayed" not in done.headers
    assert len(fake.refunds_in(acct)) == 1


def test_idempotency_keys_are_scoped_to_the_account(fake: FakeStripe, http: httpx.Client) -> None:
    a, b = fake.add_account("acct_KA"), fake.add_account("acct_KB")
    pa = fake.add_payment_intent("pi_same", amount=3000, account=a)["id"]
    fake.add_payment_intent("pi_same", amount=3000, account=b)
    form = {"payment_intent": pa, "amount": "100"}

    first = http.post(
        "/v1/refunds", data=form, headers={"Idempotency-Key": "k", "Stripe-Account": a}
    )
    other = http.post(
        "/v1/refunds", data=form, headers={"Idempotency-Key": "k", "Stripe-Account": b}
    )
    again = http.post(
        "/v1/refunds", data=form, headers={"Idempotency-Key": "k", "Stripe-Account": a}
    )

    assert first.status_code == other.status_code == again.status_code == 200
    assert "Idempotent-Replayed" not in other.headers  # a key means nothing on another account
    assert (
        again.headers["Idempotent-Replayed"] == "true" and again.json()["id"] == first.json()["id"]
    )
    assert len(fake.refunds_in(a)) == len(fake.refunds_in(b)) == 1


def test_an_account_is_added_once(fake: FakeStripe) -> None:
    fake.add_account("acct_once")
    with pytest.raises(ValueError, match="already exists"):
        fake.add_account("acct_once")
    with pytest.raises(KeyError, match="add_account"):
        fake.add_payment_intent(account="acct_never")


# -- charges, their payment intents, the legacy refund endpoints ---------------------------------


def test_a_charge_names_its_payment_intent(fake: FakeStripe) -> None:
    pi = fake.add_payment_intent(amount=2500)
    charge = sdk(fake).v1.charges.retrieve(pi["latest_charge"])
    assert charge.payment_intent == pi["id"] and charge.amount == 2500


def test_legacy_charge_refund_answers_the_charge(fake: FakeStripe, http: httpx.Client) -> None:
    pi = fake.add_payment_intent(amount=2500)
    charge = pi["latest_charge"]

    answer = http.post(f"/v1/charges/{charge}/refund", data={"amount": "500"})

    assert answer.status_code == 200
    body = answer.json()
    assert (body["object"], body["id"], body["amount_refunded"]) == ("charge", charge, 500)
    [made] = fake.refunds
    assert (made["charge"], made["payment_intent"], made["amount"]) == (charge, pi["id"], 500)


def test_legacy_charge_refunds_answers_the_refund(fake: FakeStripe, http: httpx.Client) -> None:
    pi = fake.add_payment_intent(amount=2500)
    charge = pi["latest_charge"]

    whole = http.post(f"/v1/charges/{charge}/refunds", data={})
    again = http.post(f"/v1/charges/{charge}/refund", data={})

    assert whole.status_code == 200 and whole.json()["object"] == "refund"
    assert whole.json()["amount"] == 2500  # no amount: whatever remains
    assert again.status_code == 400 and again.json()["error"]["code"] == "charge_already_refunded"
    assert len(fake.refunds) == 1


@pytest.mark.parametrize("path", ["refund", "refunds"])
def test_legacy_endpoints_refuse_another_payment_in_the_body(
    fake: FakeStripe, http: httpx.Client, path: str
) -> None:
    pi = fake.add_payment_intent(amount=2500)
    other = fake.add_payment_intent(amount=2500)
    answer = http.post(
        f"/v1/charges/{pi['latest_charge']}/{path}", data={"payment_intent": other["id"]}
    )
    assert answer.status_code == 400 and fake.refunds == []


# -- what the idempotency layer stores -----------------------------------------------------------


def test_a_401_stores_nothing_under_the_key(fake: FakeStripe) -> None:
    pi = fake.add_payment_intent(amount=2500)["id"]
    params = {"payment_intent": pi, "amount": 100}
    options = {"idempotency_key": "k-401"}
    with pytest.raises(stripe.AuthenticationError):
        sdk(fake, "sk_live_wrong").v1.refunds.create(params=params, options=options)  # type: ignore[arg-type]

    done = sdk(fake).v1.refunds.create(params=params, options=options)  # type: ignore[arg-type]

    assert done.amount == 100 and len(fake.refunds) == 1
    assert done.last_response.headers.get("Idempotent-Replayed") is None


@pytest.mark.parametrize("status", [429, 409])
def test_a_refusal_in_front_of_the_layer_stores_nothing(
    fake: FakeStripe, http: httpx.Client, status: int
) -> None:
    pi = fake.add_payment_intent(amount=2500)["id"]
    form = {"payment_intent": pi, "amount": "100"}
    fake.fail_next(status)

    stopped = http.post("/v1/refunds", data=form, headers={"Idempotency-Key": f"k-{status}"})
    done = http.post("/v1/refunds", data=form, headers={"Idempotency-Key": f"k-{status}"})
    again = http.post("/v1/refunds", data=form, headers={"Idempotency-Key": f"k-{status}"})

    assert stopped.status_code == status and len(fake.refunds) == 1
    assert done.status_code == 200 and "Idempotent-Replayed" not in done.headers
    assert again.headers["Idempotent-Replayed"] == "true" and again.json() == done.json()


def test_a_stored_refusal_is_replayed(fake: FakeStripe, http: httpx.Client) -> None:
    pi = fake.add_payment_intent(amount=50)["id"]
    form = {"payment_intent": pi, "amount": "100"}
    first = http.post("/v1/refunds", data=form, headers={"Idempotency-Key": "k-big"})
    again = http.post("/v1/refunds", data=form, headers={"Idempotency-Key": "k-big"})
    assert first.status_code == again.status_code == 400
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["error"]["code"] == "amount_too_large"


def test_a_key_in_use_is_answered_409_and_the_first_request_finishes(
    fake: FakeStripe, http: httpx.Client
) -> None:
    pi = fake.add_payment_intent(amount=2500)["id"]
    form = {"payment_intent": pi, "amount": "100"}
    headers = {"Idempotency-Key": "k-busy"}
    fake.delay_next(1.0)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(http.post, "/v1/refunds", data=form, headers=headers)
        deadline = time.monotonic() + 5
        while fake.count("POST", "/v1/refunds") == 0 and time.monotonic() < deadline:
            time.sleep(0.01)

        busy = http.post("/v1/refunds", data=form, headers=headers)
        other_account = http.post(
            "/v1/refunds", data=form, headers=headers | {"Stripe-Account": "acct_elsewhere"}
        )

        assert busy.status_code == 409
        assert busy.json()["error"]["code"] == "idempotency_key_in_use"
        assert other_account.status_code == 403  # another account's key: not busy, unknown
        assert first.result(timeout=10).status_code == 200
    again = http.post("/v1/refunds", data=form, headers=headers)
    assert again.headers["Idempotent-Replayed"] == "true" and len(fake.refunds) == 1
