"""A refund framed on the wire otherwise than with a plain Content-Length, sent as raw bytes
through a real sidecar to the fake Stripe: chunked, with chunk extensions, with
``Expect: 100-continue``, with a transfer coding before ``chunked``. Each is decided on the
body as Stripe receives it (the harness policy asks approval above 100000, so 900000 is
stopped and nothing reaches Stripe); a small one commits once and its chunked retry is the
duplicate it is. A chunked body with trailers (which mitmproxy does not read) reaches nothing,
is logged in one line (not as mitmproxy's crash with a traceback), and the sidecar goes on
serving.
"""

from __future__ import annotations

import re

import pytest
from harness import STRIPE_KEY, Sidecar
from rawproxy import exchange

from ctrlrun.proxy.master import TRAILERS
from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(180)


def framed(head: list[str], body: bytes) -> bytes:
    """A POST /v1/refunds with ``head`` as its framing headers, then ``body`` as sent."""
    lines = [
        "POST /v1/refunds HTTP/1.1",
        "Host: api.stripe.com",
        f"Authorization: Bearer {STRIPE_KEY}",
        "Content-Type: application/x-www-form-urlencoded",
        "Connection: close",
        *head,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chunked(body: bytes, ext: str = "", trailer: str = "") -> bytes:
    """``body`` in two chunks (the second with ``ext``), then the last chunk and ``trailer``."""
    half = len(body) // 2
    first, second = body[:half], body[half:]
    return (
        f"{len(first):x}\r\n".encode()
        + first
        + f"\r\n{len(second):x}{ext}\r\n".encode()
        + second
        + b"\r\n0\r\n"
        + trailer.encode()
        + b"\r\n"
    )


def outcome(answer: bytes) -> str | None:
    found = re.search(rb"\r\nx-ctrlrun-outcome: *([a-z_]+)", answer, re.I)
    return found[1].decode() if found else None


def framings(body: bytes) -> list[bytes]:
    te = "Transfer-Encoding: chunked"
    return [
        framed([te], chunked(body)),
        framed([te], chunked(body, ext=";amount=1")),
        framed([te.replace("chunked", "gzip, chunked")], chunked(body)),
        framed(["Expect: 100-continue", f"Content-Length: {len(body)}"], body),
    ]


def test_a_refund_in_any_framing_is_decided_on_the_body_stripe_receives(
    sidecar: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    stripe = fakes[0]
    pi = str(stripe.add_payment_intent(amount=1_000_000)["id"])
    for data in framings(f"payment_intent={pi}&amount=900000".encode()):
        answer = exchange(sidecar.stripe_base, data, wait=10)
        assert outcome(answer) == "approval_required", (data, answer[:300])
    assert stripe.requests == []
    small = framings(f"payment_intent={pi}&amount=500".encode())
    assert b" 200 " in exchange(sidecar.stripe_base, small[0], wait=10).split(b"\r\n")[0]
    for data in small[1:]:
        answer = exchange(sidecar.stripe_base, data, wait=10)
        assert outcome(answer) == "duplicate", (data, answer[:300])
    assert [r["amount"] for r in stripe.refunds] == [500]


def test_a_chunked_refund_with_trailers_reaches_nothing(
    sidecar: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], caplog: pytest.LogCaptureFixture
) -> None:
    stripe = fakes[0]
    pi = str(stripe.add_payment_intent(amount=1_000_000)["id"])
    body = f"payment_intent={pi}&amount=500".encode()
    trailers = ("Stripe-Account: acct_other\r\n", "Content-Length: 5\r\n", "X-A: 1\r\n")
    for trailer in trailers:
        data = framed(["Transfer-Encoding: chunked", "Trailer: X-A"], chunked(body, "", trailer))
        answer = exchange(sidecar.stripe_base, data, wait=5)
        assert b" 200 " not in answer.split(b"\r\n")[0], answer[:300]
    assert stripe.requests == []
    dropped = [r for r in caplog.records if r.getMessage() == TRAILERS]
    assert len(dropped) == len(trailers), caplog.text
    assert "Traceback" not in caplog.text and "crashed" not in caplog.text, caplog.text
    plain = framed([f"Content-Length: {len(body)}"], body)
    assert b" 200 " in exchange(sidecar.stripe_base, plain, wait=10).split(b"\r\n")[0]
    assert [r["amount"] for r in stripe.refunds] == [500]
