"""The Stripe reconciler asks on the account the action acted on (its ``account`` argument),
even with no request headers at hand (the sweep after a restart): asked on the platform's own
account, a connected account's refund is not there, and "nothing there" is no evidence."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

from ctrlrun.reconcilers import StripeReconciler
from ctrlrun.testing import FakeStripe

KEY = "sk_test_reconcile_accounts"


def refund_on(fake: FakeStripe, account: str, pi: str, key: str) -> None:
    answer = httpx.post(
        f"{fake.url}/v1/refunds",
        data={"payment_intent": pi, "amount": "500"},
        headers={
            "Authorization": f"Bearer {KEY}",
            "Stripe-Account": account,
            "Idempotency-Key": key,
        },
        timeout=5,
        trust_env=False,
    )
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("credentials", [{}, {"authorization": f"Bearer {KEY}"}])
def test_a_connected_accounts_refund_is_found_on_that_account(
    stripe_fake: FakeStripe, credentials: dict[str, str]
) -> None:
    acct = stripe_fake.add_account("acct_R1")
    pi = stripe_fake.add_payment_intent(amount=5000, account=acct)["id"]
    started = datetime.now(UTC)
    refund_on(stripe_fake, acct, pi, "attempt-1")
    reconciler = StripeReconciler(stripe_fake.url, api_key=KEY)
    args = {"payment_intent": pi, "amount": 500, "payment_id": pi}

    found = reconciler.answer(
        "stripe.refund",
        args | {"account": acct},
        started_at=started,
        idempotency_keys=["attempt-1"],
        credentials=credentials,
    )

    assert found == "committed"


def test_the_own_account_is_asked_without_stripe_account(stripe_fake: FakeStripe) -> None:
    pi = stripe_fake.add_payment_intent(amount=5000)["id"]
    started = datetime.now(UTC)
    stripe_fake.add_refund(payment_intent=pi, amount=500, idempotency_key="attempt-2")
    reconciler = StripeReconciler(stripe_fake.url, api_key=KEY)

    found = reconciler.answer(
        "stripe.refund",
        {"payment_intent": pi, "amount": 500, "account": "self"},
        started_at=started,
        idempotency_keys=["attempt-2"],
    )

    assert found == "committed"
