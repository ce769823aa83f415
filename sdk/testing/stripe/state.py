"""The fake Stripe account: payment intents, charges, refunds, payouts, customers, events.

Operations take parsed parameters, change the account and return the new object, or raise
:class:`StripeError`. The caller holds the lock; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from . import objects
from .wire import (
    Params,
    StripeError,
    StripeObject,
    created_matches,
    int_param,
    list_page,
    metadata_param,
    new_id,
    newest_first,
    required,
    required_int,
)

REFUND_REASONS = frozenset({"duplicate", "fraudulent", "requested_by_customer"})
CANCELABLE = frozenset(
    {
        "requires_payment_method",
        "requires_capture",
        "requires_confirmation",
        "requires_action",
        "processing",
    }
)
CHARGED = frozenset({"succeeded", "requires_capture"})


class StripeState:
    """Everything one fake Stripe account holds."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.payment_intents: dict[str, StripeObject] = {}
        self.charges: dict[str, StripeObject] = {}
        self.refunds: dict[str, StripeObject] = {}  # insertion (creation) order
        self.customers: dict[str, StripeObject] = {}
        self.payouts: dict[str, StripeObject] = {}
        self.events: dict[str, StripeObject] = {}

    def now(self) -> int:
        return int(self.clock())

    # -- seeding ---------------------------------------------------------------------------

    def add_payment_intent(
        self,
        pi_id: str | None,
        amount: int,
        currency: str,
        status: str,
        metadata: Mapping[str, str],
        created: int | None,
    ) -> StripeObject:
        pi_id = pi_id or new_id("pi_")
        if pi_id in self.payment_intents:
            raise ValueError(f"payment intent {pi_id} already exists")
        when = self.now() if created is None else created
        pi = objects.payment_intent(amount, currency, status, when) | {"id": pi_id}
        pi["metadata"] = dict(metadata)
        if status in CHARGED:
            ch = objects.charge(amount, currency, when, captured=status == "succeeded")
            ch["payment_intent"] = pi_id
            self.charges[ch["id"]] = ch
            pi["latest_charge"] = ch["id"]
        self.payment_intents[pi_id] = pi
        return pi

    def add_customer(
        self, customer_id: str | None, email: str | None, name: str | None
    ) -> StripeObject:
        customer = objects.customer(email, name, self.now())
        customer["id"] = customer_id or customer["id"]
        self.customers[customer["id"]] = customer
        return customer

    # -- writes ----------------------------------------------------------------------------

    def create_refund(self, params: Params, request: Mapping[str, str | None]) -> StripeObject:
        pi_id, charge_id = params.get("payment_intent"), params.get("charge")
        if not pi_id and not charge_id:
            raise StripeError(
                400,
                "One of the following params should be provided for this "
                "request: payment_intent or charge.",
                code="parameter_missing",
            )
        if pi_id and charge_id:
            raise StripeError(
                400,
                "You cannot specify both payment_intent and charge.",
                code="parameter_invalid_string",
                param="charge",
            )
        amount = int_param(params, "amount", minimum=1)
        reason = params.get("reason") or None
        if reason is not None and reason not in REFUND_REASONS:
            raise StripeError(
                400,
                f"Invalid reason: must be one of {sorted(REFUND_REASONS)}",
                code="parameter_invalid_string",
                param="reason",
            )
        metadata = metadata_param(params)
        charge = self._charge_of(pi_id, charge_id)
        remaining = int(charge["amount"]) - int(charge["amount_refunded"])
        if remaining <= 0:
            raise StripeError(
                400,
                f"Charge {charge['id']} has already been refunded.",
                code="charge_already_refunded",
                stored=True,
            )
        if amount is not None and amount > remaining:
            raise StripeError(
                400,
                f"Refund amount ({amount}) is greater than unrefunded amount "
                f"on charge ({remaining})",
                code="amount_too_large",
                param="amount",
                stored=True,
            )
        return self.insert_refund(
            charge, remaining if amount is None else amount, self.now(), reason, metadata, request
        )

    def refund_charge(
        self, charge_id: str, params: Params, request: Mapping[str, str | None]
    ) -> StripeObject:
        """``POST /v1/charges/{id}/refund``: refund it and answer the charge, as Stripe does."""
        if params.get("charge") or params.get("payment_intent"):
            raise StripeError(400, "Received unknown parameter: charge", code="parameter_unknown")
        self.create_refund({**params, "charge": charge_id}, request)
        return self.charges[charge_id]

    def insert_refund(
        self,
        charge: StripeObject,
        amount: int,
        created: int,
        reason: str | None,
        metadata: Mapping[str, str],
        request: Mapping[str, str | None],
    ) -> StripeObject:
        refund = objects.refund(charge, amount, created, reason, metadata)
        self.refunds[refund["id"]] = refund
        charge["amount_refunded"] = int(charge["amount_refunded"]) + amount
        charge["refunded"] = charge["amount_refunded"] >= charge["amount"]
        self.emit("refund.created", refund, request, created)
        self.emit("charge.refunded", charge, request, created)
        return refund

    def cancel_payment_intent(
        self, pi_id: str, params: Params, request: Mapping[str, str | None]
    ) -> StripeObject:
        pi = self.get("payment_intent", pi_id)
        if pi["status"] not in CANCELABLE:
            raise StripeError(
                400,
                f"You cannot cancel this PaymentIntent because it has a status of "
                f"{pi['status']}. Only a PaymentIntent with one of the following statuses may be "
                f"canceled: {', '.join(sorted(CANCELABLE))}.",
                code="payment_intent_unexpected_state",
                stored=True,
            )
        pi.update(
            status="canceled",
            canceled_at=self.now(),
            cancellation_reason=params.get("cancellation_reason") or None,
        )
        self.emit("payment_intent.canceled", pi, request)
        return pi

    def create_payout(self, params: Params, request: Mapping[str, str | None]) -> StripeObject:
        amount = required_int(params, "amount", minimum=1)
        currency = str(required(params, "currency"))
        payout = objects.payout(amount, currency, self.now(), params)
        payout["metadata"] = metadata_param(params)
        self.payouts[payout["id"]] = payout
        self.emit("payout.created", payout, request)
        return payout

    def create_charge(self, params: Params, request: Mapping[str, str | None]) -> StripeObject:
        amount = required_int(params, "amount", minimum=1)
        currency = str(required(params, "currency"))
        charge = objects.charge(
            amount,
            currency,
            self.now(),
            customer=params.get("customer"),
            description=params.get("description"),
            metadata=metadata_param(params),
        )
        self.charges[charge["id"]] = charge
        self.emit("charge.succeeded", charge, request)
        return charge

    def delete_customer(self, customer_id: str, request: Mapping[str, str | None]) -> StripeObject:
        customer = self.get("customer", customer_id)
        if customer.get("deleted"):
            raise StripeError(
                404, f"No such customer: '{customer_id}'", code="resource_missing", param="id"
            )
        self.customers[customer_id] = {"id": customer_id, "object": "customer", "deleted": True}
        self.emit("customer.deleted", customer, request)
        return self.customers[customer_id]

    def emit(
        self,
        kind: str,
        obj: StripeObject,
        request: Mapping[str, str | None],
        created: int | None = None,
    ) -> None:
        when = self.now() if created is None else created
        evt = objects.event(kind, obj, request, when)
        self.events[evt["id"]] = evt

    # -- reads -----------------------------------------------------------------------------

    def get(self, kind: str, object_id: str) -> StripeObject:
        table: dict[str, StripeObject] = {
            "payment_intent": self.payment_intents,
            "charge": self.charges,
            "refund": self.refunds,
            "customer": self.customers,
            "payout": self.payouts,
            "event": self.events,
        }[kind]
        found = table.get(object_id)
        if found is None:
            raise StripeError(
                404, f"No such {kind}: '{object_id}'", code="resource_missing", param="id"
            )
        return found

    def list_of(self, kind: str, params: Params, fields: tuple[str, ...]) -> dict[str, Any]:
        """A page of refunds, charges or payouts, filtered by ``fields`` and ``created``."""
        table = {"refund": self.refunds, "charge": self.charges, "payout": self.payouts}[kind]

        def keep(obj: StripeObject) -> bool:
            return all(
                not params.get(f) or obj.get(f) == params[f] for f in fields
            ) and created_matches(params, int(obj["created"]))

        ordered = newest_first(table.values())
        return list_page(ordered, params, f"/v1/{kind}s", keep, kind)

    def list_events(self, params: Params) -> dict[str, Any]:
        types = params.get("types") or ([params["type"]] if params.get("type") else [])
        if not isinstance(types, list):
            raise StripeError(400, "Invalid array", code="parameter_invalid_array", param="types")

        def type_matches(kind: str) -> bool:
            return not types or any(
                kind == t or (t.endswith("*") and kind.startswith(t[:-1])) for t in types
            )

        def keep(event: StripeObject) -> bool:
            return type_matches(str(event["type"])) and created_matches(
                params, int(event["created"])
            )

        ordered = newest_first(self.events.values())
        return list_page(ordered, params, "/v1/events", keep, "event")

    def _charge_of(self, pi_id: str | None, charge_id: str | None) -> StripeObject:
        if charge_id:
            return self.get("charge", charge_id)
        pi = self.get("payment_intent", str(pi_id))
        latest = pi.get("latest_charge")
        if pi["status"] != "succeeded" or not latest:
            raise StripeError(
                400,
                f"This PaymentIntent ({pi['id']}) does not have a successful charge to refund.",
                code="payment_intent_unexpected_state",
                param="payment_intent",
                stored=True,
            )
        return self.charges[str(latest)]
