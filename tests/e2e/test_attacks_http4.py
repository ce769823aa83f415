"""One order under two effect keys: ``profile: http`` ids a server reads as the refunded one.

The effect key is ``refund:{order}``, made of the id as sent; a server looking the order up
by an integer key (Rails' ``find``, Django's ``get(pk=...)``, ``Number()``, MySQL comparing a
string with an integer column) finds order 7 for ``007``, ``+7``, `` 7``, ``7.0``, ``7e0``,
``0x7`` or ``٧``, and a server stripping spaces finds ``o1`` for ``o1 ``. Sent through a real
sidecar to a real HTTP server after the plain refund, each must be refused with a receipt,
never forwarded as the fresh key it would be.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from billing_support import Billing, billing_sidecar, receipts
from harness import Sidecar

pytestmark = pytest.mark.timeout(120)

# Formatted by the harness: braces are doubled.
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  billing.refund:
    effect: "refund:{{order}}"
    decision: allow
upstreams:
  billing:
    profile: http
    url: http://127.0.0.1:PORT
    routes:
      - {{method: POST, path: "/v1/orders/{{order}}/refund", action: billing.refund}}
      - {{method: POST, path: "/v1/refunds", action: billing.refund}}
"""
JSON = {"Content-Type": "application/json"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[Sidecar, Billing]]:
    with billing_sidecar(tmp_path, POLICY) as both:
        yield both


# (target, headers, body): each the refund of order 7 (or o1) again, to some server.
RESPELT = [
    ("/v1/orders/007/refund", {}, b""),
    ("/v1/orders/+7/refund", {}, b""),
    ("/v1/orders/%207/refund", {}, b""),
    ("/v1/orders/7%20/refund", {}, b""),
    ("/v1/orders/7.0/refund", {}, b""),
    ("/v1/orders/7e0/refund", {}, b""),
    ("/v1/orders/0x7/refund", {}, b""),
    ("/v1/orders/7_0/refund", {}, b""),  # int("7_0") is 70: another number, spelt unplainly
    ("/v1/orders/%D9%A7/refund", {}, b""),  # ARABIC-INDIC DIGIT SEVEN: int() reads 7
    ("/v1/refunds", JSON, b'{"order":"07"}'),
    ("/v1/refunds", JSON, b'{"order":"-0"}'),
    ("/v1/refunds", FORM, b"order=7.00"),
    ("/v1/refunds?order=%2B7", {}, b""),
    ("/v1/refunds", JSON, b'{"order":"o1 "}'),
    ("/v1/refunds", FORM, b"order=+o1"),
]


def test_an_order_spelt_otherwise_is_not_a_fresh_effect_key(
    rig: tuple[Sidecar, Billing],
) -> None:
    sc, billing = rig
    base = f"http://127.0.0.1:{billing.port}"
    with httpx.Client(proxy=sc.proxy_url, trust_env=False, timeout=30) as http:
        for target in ("/v1/orders/7/refund", "/v1/orders/o1/refund"):
            assert http.post(base + target).status_code == 200
        for target, headers, body in RESPELT:
            got = http.post(base + target, content=body, headers=headers)
            assert got.status_code == 400, (target, body, got.text)
            assert got.headers["x-ctrlrun-outcome"] == "invalid_request", got.text
            assert "the effect key would differ" in got.text, got.text
        # The same orders spelt plainly are the same keys: refused as the duplicates they are.
        for body in (b'{"order":7}', b'{"order":"7"}', b'{"order":"o1"}'):
            again = http.post(base + "/v1/refunds", content=body, headers=JSON)
            assert again.headers["x-ctrlrun-outcome"] == "duplicate", again.text
        # Ids that merely hold digits are ids like any other.
        for order in ("ord-007", "2024-01-07", "7abc", "inf", "1.2.3"):
            fresh = http.post(
                base + "/v1/refunds", content=json.dumps({"order": order}).encode(), headers=JSON
            )
            assert fresh.status_code == 200, (order, fresh.text)
    assert [target for _, target, _ in billing.received][:2] == [
        "/v1/orders/7/refund",
        "/v1/orders/o1/refund",
    ]
    assert len(billing.received) == 2 + 5
    got = receipts(sc)
    assert got[:2] == [("billing.refund", "committed")] * 2
    assert [result for _, result in got[2 : 2 + len(RESPELT)]] == ["denied"] * len(RESPELT)
