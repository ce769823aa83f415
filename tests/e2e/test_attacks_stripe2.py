"""More Stripe requests a server may read otherwise than ctrlrun, through a real sidecar to
the fake Stripe: each is refused with ctrlrun's answer and a receipt, and nothing moves.

A '#' in a request target: clients strip fragments before they send, so one that arrives is
read differently by each server (Puma and Express end the query there, Go's net/http and a
plain split on '?' read on), while mitmproxy's parsed query stops at it. ctrlrun would decide
the refund on the parameters before the '#' and forward those after it unseen.

Refunds by another road: a credit note with ``refund_amount`` and a Terminal reader's
``refund_payment`` make a refund too; under ``unmapped_writes: allow`` they would be
forwarded as unmapped writes, past the refund's policy and its one-refund-per-payment key.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import POLICY, STRIPE_KEY, Sidecar, running_sidecar
from test_attacks_stripe import FORM, post

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(180)
AUTH = ("Authorization", f"Bearer {STRIPE_KEY}")


def receipts(sidecar: Sidecar) -> list[str]:
    return [r.result for r in sidecar.receipts()]


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


OPEN = POLICY.replace("    api_key_env:", "    unmapped_writes: allow\n    api_key_env:", 1)


@pytest.fixture
def open_sidecar(tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[Sidecar]:
    """The Stripe upstream with ``unmapped_writes: allow``."""
    with running_sidecar(tmp_path, *fakes, policy_text=OPEN, in_process=True) as sc:
        yield sc


def test_a_refund_by_another_road_is_refused_even_where_unmapped_writes_go(
    open_sidecar: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    stripe = fakes[0]
    headers = [AUTH, ("Content-Type", FORM)]
    refunds = [
        ("/v1/credit_notes", b"invoice=in_1&amount=900000&refund_amount=900000"),
        ("/v1/credit_notes", b"invoice=in_1&amount=900000&refund_amount=900000&expand[]=refund"),
        ("/v1/terminal/readers/tmr_1/refund_payment", b"payment_intent=pi_1&amount=900000"),
        ("/v1/Credit_Notes", b"invoice=in_1&amount=5"),  # a route as a loose server reads it
    ]
    for path, body in refunds:
        status, got, text = post(open_sidecar.stripe_base, path, headers, body)
        assert status == 400, (path, text)
        assert got["x-ctrlrun-outcome"] == "invalid_request", text
        assert json.loads(text)["error"]["message"].startswith("ctrlrun: "), text
    assert stripe.requests == []
    # A credit note that refunds nothing new (a customer balance credit, a linked refund)
    # is an unmapped write like any other, and goes as the upstream allows.
    for body in (b"invoice=in_1&credit_amount=5", b"invoice=in_1&refunds[0][refund]=re_1"):
        _, got, text = post(open_sidecar.stripe_base, "/v1/credit_notes", headers, body)
        assert "x-ctrlrun-outcome" not in got, text
    assert stripe.requests == [("POST", "/v1/credit_notes")] * 2
    # (The fake keeps no invoices: its 404 makes those two receipts "failed".)
    assert receipts(open_sidecar) == ["denied"] * len(refunds) + ["failed"] * 2
