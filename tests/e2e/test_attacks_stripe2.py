"""More Stripe requests a server may read otherwise than ctrlrun, through a real sidecar to
the fake Stripe: each is refused with ctrlrun's answer and a receipt, and nothing moves.

A '#' in a request target: clients strip fragments before they send, so one that arrives is
read differently by each server (Puma and Express end the query there, Go's net/http and a
plain split on '?' read on), while mitmproxy's parsed query stops at it. ctrlrun would decide
the refund on the parameters before the '#' and forward those after it unseen.
"""

from __future__ import annotations

import json

import pytest
from harness import STRIPE_KEY, Sidecar
from test_attacks_stripe import FORM, post

from ctrlrun.receipts import load_receipts
from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(180)
AUTH = ("Authorization", f"Bearer {STRIPE_KEY}")


def receipts(sidecar: Sidecar) -> list[str]:
    store = sidecar.store()
    try:
        with store.reading() as conn:
            return [r.result for r in load_receipts(conn)]
    finally:
        store.close()


@pytest.mark.parametrize(
    ("target", "body"),
    [
        # ctrlrun would read amount=1 only; the target carries amount=900000 too.
        ("/v1/refunds?metadata[n]=#&amount=900000", b"payment_intent=PI&amount=1"),
        ("/v1/refunds?amount=1#", b"payment_intent=PI"),
        ("/v1/refunds#?amount=900000", b"payment_intent=PI&amount=1"),
    ],
)
def test_a_target_with_a_fragment_is_refused(
    sidecar: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], target: str, body: bytes
) -> None:
    stripe = fakes[0]
    pi = str(stripe.add_payment_intent(amount=1_000_000)["id"])
    headers = [AUTH, ("Content-Type", FORM)]
    status, got, text = post(sidecar.stripe_base, target, headers, body.replace(b"PI", pi.encode()))
    assert status == 400, text
    assert got["x-ctrlrun-outcome"] == "invalid_request", text
    assert "'#'" in json.loads(text)["error"]["message"], text
    assert stripe.refunds == []
    assert receipts(sidecar) == ["denied"]
