"""Helpers for the Stripe end-to-end tests: the official client with bounded calls, what
ctrlrun answered, and the ledger read back."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import stripe
from harness import STRIPE_KEY, Sidecar

from ctrlrun import ledger
from ctrlrun.states import EffectRecord

CLIENT_TIMEOUT = 15  # seconds, for every request the official client makes


def stripe_client(
    base: str, *, proxy: str | None = None, retries: int = 2, api_key: str = STRIPE_KEY
) -> stripe.StripeClient:
    """The official client as an agent builds it (retries on), with a bounded timeout.

    ``proxy=None`` leaves requests free to read ``HTTPS_PROXY`` from the environment.
    """
    http = stripe.RequestsClient(timeout=CLIENT_TIMEOUT, proxy=proxy)
    return stripe.StripeClient(
        api_key, base_addresses={"api": base}, max_network_retries=retries, http_client=http
    )


def refund(
    client: stripe.StripeClient, payment_intent: str, amount: int, **options: Any
) -> stripe.Refund:
    params: dict[str, Any] = {"payment_intent": payment_intent, "amount": amount}
    return client.v1.refunds.create(params=params, options=options or None)  # type: ignore[arg-type]


def refused(call: Callable[[], object]) -> stripe.StripeError:
    """The Stripe error ``call`` raised; fails the test when it succeeded."""
    with pytest.raises(stripe.StripeError) as info:
        call()
    return info.value


def header(err: stripe.StripeError, name: str) -> str | None:
    for key, value in (err.headers or {}).items():
        if key.lower() == name.lower():
            return str(value)
    return None


def ctrlrun_block(err: stripe.StripeError) -> dict[str, Any]:
    """The ``ctrlrun`` block of a synthesised answer (asserting the answer is one)."""
    body = err.json_body or {}
    assert header(err, "X-Ctrlrun-Outcome") == body["ctrlrun"]["outcome"], body
    assert header(err, "Stripe-Should-Retry") == "false", err.headers
    assert err.user_message and err.user_message.startswith("ctrlrun:"), err.user_message
    assert body["error"]["code"] == f"ctrlrun_{body['ctrlrun']['outcome']}", body
    block: dict[str, Any] = body["ctrlrun"]
    return block


def outcome(err: stripe.StripeError) -> str:
    return str(ctrlrun_block(err)["outcome"])


def effect(sc: Sidecar, key: str) -> EffectRecord | None:
    store = sc.store()
    try:
        with store.reading() as conn:
            return ledger.get_effect(conn, key)
    finally:
        store.close()


def receipts_for(sc: Sidecar, key: str) -> list[dict[str, Any]]:
    """Every receipt written for ``key``, oldest first (read from the store)."""
    return [r.to_dict() for r in sc.receipts() if r.document.get("effect_key") == key]


def timeline(sc: Sidecar) -> list[dict[str, Any]]:
    """``ctrlrun receipts --json``: receipts and reconciliation events, as a user reads them."""
    done = sc.cli("receipts", "--json", "--store-url", sc.store_url, timeout=30)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def events_for(lines: list[dict[str, Any]], key: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (e["type"], e["data"]) for e in lines if e["kind"] == "event" and e["effect_key"] == key
    ]
