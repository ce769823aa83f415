"""Refunds spelt the ways a server might read as a refund, through a real sidecar to the fake
Stripe: each is refused with ctrlrun's answer and a receipt, and no refund is made; the
plain refund still goes through, once.
"""

from __future__ import annotations

import http.client
import json

import pytest
from harness import STRIPE_KEY, Sidecar

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(180)
FORM = "application/x-www-form-urlencoded"

# (path, extra headers, body): every one a refund of 900000 to some server, or unreadable.
ATTACKS: list[tuple[str, list[tuple[str, str]], bytes]] = [
    ("/v1//refunds", [], b"payment_intent=PI&amount=900000"),
    ("/v1/./refunds", [], b"payment_intent=PI&amount=900000"),
    ("/v1/x/../refunds", [], b"payment_intent=PI&amount=900000"),
    ("/v1%2Frefunds", [], b"payment_intent=PI&amount=900000"),
    ("/v1%2frefunds", [], b"payment_intent=PI&amount=900000"),
    ("/v1/refunds;x=1", [], b"payment_intent=PI&amount=900000"),
    ("/v1/refunds.json", [], b"payment_intent=PI&amount=900000"),
    ("/V1/Refunds", [], b"payment_intent=PI&amount=900000"),
    ("/v1\\refunds", [], b"payment_intent=PI&amount=900000"),
    ("/v1/refunds?amount=900000", [], b"payment_intent=PI&amount=1"),
    ("/v1/refunds?payment_intent=PI;amount=900000", [], b"amount=1"),
    ("/v1/refunds", [], b"payment_intent=PI&amount=1&amount=900000"),
    ("/v1/refunds", [], b"payment_intent=PI&amount[]=900000"),
    ("/v1/refunds", [], b"payment_intent=PI&amount=9e5"),
    ("/v1/refunds", [], b"payment_intent=PI&amount=%2B900000"),
    ("/v1/refunds", [], b"payment_intent=PI&amount=1&_method=DELETE"),
    ("/v1/refunds", [("Content-Encoding", "gzip")], b"payment_intent=PI&amount=1"),
    ("/v1/refunds", [("Content-Type", "application/json")], b"payment_intent=PI&amount=1"),
    ("/v1/refunds", [("Content-Type", f"{FORM}; charset=utf-7")], b"payment_intent=PI&amount=1"),
    ("/v1/refunds", [("Idempotency-Key", "a"), ("Idempotency-Key", "b")], b"payment_intent=PI"),
    ("/v1/refunds", [("Idempotency_Key", "a")], b"payment_intent=PI&amount=1"),
    ("/v1/refunds", [("Stripe-Account", "acct_1"), ("Stripe-Account", "acct_2")], b"amount=1"),
    ("/v1/refunds", [("X-HTTP-Method-Override", "GET")], b"payment_intent=PI&amount=1"),
    ("/v1/refunds", [("X_HTTP_METHOD_OVERRIDE", "GET")], b"payment_intent=PI&amount=1"),
]


@pytest.fixture
def pi(fakes: tuple[FakeStripe, FakeKubernetes]) -> str:
    return str(fakes[0].add_payment_intent(amount=1_000_000)["id"])


def post(
    base: str, path: str, headers: list[tuple[str, str]], body: bytes
) -> tuple[int, dict[str, str], bytes]:
    """One POST with the exact path and headers given (http.client normalises neither)."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("POST", path, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        got = conn.getresponse()
        return got.status, {k.lower(): v for k, v in got.getheaders()}, got.read()
    finally:
        conn.close()


def test_refunds_spelt_otherwise_are_refused_with_a_receipt_and_make_no_refund(
    sidecar: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], pi: str
) -> None:
    stripe = fakes[0]
    auth = ("Authorization", f"Bearer {STRIPE_KEY}")
    for path, extra, body in ATTACKS:
        headers = [auth, *extra]
        if not any(k.lower() == "content-type" for k, _ in extra):
            headers.append(("Content-Type", FORM))
        status, got, text = post(
            sidecar.stripe_base, path.replace("PI", pi), headers, body.replace(b"PI", pi.encode())
        )
        assert status in (400, 403), (path, extra, body, status, text)
        assert got["x-ctrlrun-outcome"] in ("invalid_request", "denied"), text
        assert got["stripe-should-retry"] == "false"
        assert json.loads(text)["error"]["message"].startswith("ctrlrun: "), text
    assert stripe.refunds == []
    plain = f"payment_intent={pi}&amount=500".encode()
    status, _, text = post(
        sidecar.stripe_base, "/v1/refunds", [auth, ("Content-Type", FORM)], plain
    )
    assert status == 200, text
    assert [r["amount"] for r in stripe.refunds] == [500]
    results = [r.result for r in sidecar.receipts()]
    assert results == ["denied"] * len(ATTACKS) + ["committed"]
