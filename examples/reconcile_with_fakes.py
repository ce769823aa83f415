"""A lost Stripe reply, settled by the built-in reconciler: runnable offline against the fake.

    python examples/reconcile_with_fakes.py

The executor really POSTs a refund to a fake Stripe (a real HTTP server on loopback) that
applies it and then drops the connection. The reconciler lists the payment's refunds, finds
it, and the retry is refused as a duplicate.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import httpx

import ctrlrun
from ctrlrun import Control, Policy, SQLiteStateStore
from ctrlrun.reconcilers import stripe_refunds
from ctrlrun.testing import FakeStripe

KEY = "sk_test_example"
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: allow
"""

with FakeStripe() as stripe, tempfile.TemporaryDirectory() as tmp:
    payment = stripe.add_payment_intent(amount=5000)["id"]
    control = Control(Policy.from_yaml(POLICY), SQLiteStateStore(Path(tmp) / "state.db"))

    @ctrlrun.protect(
        "stripe.refund",
        effect="refund:{payment_id}",
        reconcile=stripe_refunds(api_key=KEY, base_url=stripe.url),
        reconcile_eagerly=True,
        control=control,
    )
    def refund(payment_id: str, amount: int) -> dict[str, object]:
        reply = httpx.post(
            f"{stripe.url}/v1/refunds",
            data={"payment_intent": payment_id, "amount": str(amount)},
            headers={
                "Authorization": f"Bearer {KEY}",
                "Idempotency-Key": ctrlrun.idempotency_token(),
            },
        )
        return dict(reply.json())

    stripe.fail_next("commit_then_drop")
    with ctrlrun.context(agent="refund-agent"):
        try:
            refund(payment_id=payment, amount=2500)
        except httpx.HTTPError as exc:
            print(f"the reply was lost ({type(exc).__name__}); the reconciler asked Stripe")
        try:
            refund(payment_id=payment, amount=2500)
        except ctrlrun.DuplicateEffect:
            print("the retry was refused: Stripe already has the refund")
    print("refunds at Stripe:", len(stripe.refunds))
