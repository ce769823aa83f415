"""The shapes of the Stripe objects the fake serves (the fields clients and reconcilers read)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from .wire import StripeObject, new_id

API_VERSION = "2026-06-24.dahlia"


def _common(prefix: str, kind: str, created: int, metadata: Mapping[str, str]) -> StripeObject:
    return {
        "id": new_id(prefix),
        "object": kind,
        "created": created,
        "livemode": False,
        "metadata": dict(metadata),
    }


def account(account_id: str) -> StripeObject:
    """The account object ``GET /v1/account`` answers (the fields a client reads of it)."""
    return {
        "id": account_id,
        "object": "account",
        "charges_enabled": True,
        "country": "US",
        "default_currency": "usd",
        "type": "standard",
    }


def payment_intent(amount: int, currency: str, status: str, created: int) -> StripeObject:
    return _common("pi_", "payment_intent", created, {}) | {
        "amount": amount,
        "amount_received": amount if status == "succeeded" else 0,
        "canceled_at": None,
        "cancellation_reason": None,
        "currency": currency,
        "customer": None,
        "latest_charge": None,
        "status": status,
    }


def charge(
    amount: int, currency: str, created: int, *, captured: bool = True, **fields: Any
) -> StripeObject:
    return (
        _common("ch_", "charge", created, fields.pop("metadata", {}))
        | {
            "amount": amount,
            "amount_captured": amount if captured else 0,
            "amount_refunded": 0,
            "captured": captured,
            "currency": currency,
            "customer": None,
            "description": None,
            "paid": True,
            "payment_intent": None,
            "refunded": False,
            "status": "succeeded",
        }
        | fields
    )


def refund(
    charge: StripeObject, amount: int, created: int, reason: str | None, metadata: Mapping[str, str]
) -> StripeObject:
    return _common("re_", "refund", created, metadata) | {
        "amount": amount,
        "balance_transaction": new_id("txn_"),
        "charge": charge["id"],
        "currency": charge["currency"],
        "destination_details": None,
        "payment_intent": charge["payment_intent"],
        "reason": reason,
        "receipt_number": None,
        "source_transfer_reversal": None,
        "status": "succeeded",
        "transfer_reversal": None,
    }


def payout(amount: int, currency: str, created: int, params: Mapping[str, Any]) -> StripeObject:
    return _common("po_", "payout", created, params.get("metadata") or {}) | {
        "amount": amount,
        "arrival_date": created + 2 * 86400,
        "currency": currency,
        "description": params.get("description"),
        "destination": params.get("destination"),
        "method": params.get("method") or "standard",
        "source_type": "card",
        "statement_descriptor": params.get("statement_descriptor"),
        "status": "pending",
    }


def customer(email: str | None, name: str | None, created: int) -> StripeObject:
    return _common("cus_", "customer", created, {}) | {"email": email, "name": name}


def event(
    kind: str, obj: StripeObject, request: Mapping[str, str | None], created: int
) -> StripeObject:
    return {
        "id": new_id("evt_"),
        "object": "event",
        "api_version": API_VERSION,
        "created": created,
        "data": {"object": copy.deepcopy(obj)},
        "livemode": False,
        "pending_webhooks": 0,
        "request": dict(request),
        "type": kind,
    }
