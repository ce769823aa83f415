"""The Stripe endpoints the fake serves: method and path to an operation on the account."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import TypeAlias

from ..messages import Request
from .state import StripeState
from .wire import Params, StripeError, StripeObject

# An operation gets the parameters, the request's origin (id, idempotency key) and the ids
# the path names.
Operation: TypeAlias = Callable[..., StripeObject]
_ID = r"([A-Za-z0-9_]+)"
_REFUND_FILTERS = ("payment_intent", "charge")
_CHARGE_FILTERS = ("customer", "payment_intent")


def _table(st: StripeState) -> list[tuple[str, str, Operation]]:
    return [
        ("POST", r"/v1/refunds", lambda p, o: st.create_refund(p, o)),
        ("GET", r"/v1/refunds", lambda p, o: st.list_of("refund", p, _REFUND_FILTERS)),
        ("GET", rf"/v1/refunds/{_ID}", lambda p, o, i: st.get("refund", i)),
        ("GET", r"/v1/events", lambda p, o: st.list_events(p)),
        ("GET", rf"/v1/events/{_ID}", lambda p, o, i: st.get("event", i)),
        ("GET", rf"/v1/payment_intents/{_ID}", lambda p, o, i: st.get("payment_intent", i)),
        (
            "POST",
            rf"/v1/payment_intents/{_ID}/cancel",
            lambda p, o, i: st.cancel_payment_intent(i, p, o),
        ),
        ("POST", r"/v1/payouts", lambda p, o: st.create_payout(p, o)),
        ("GET", r"/v1/payouts", lambda p, o: st.list_of("payout", p, ("status",))),
        ("GET", rf"/v1/payouts/{_ID}", lambda p, o, i: st.get("payout", i)),
        ("POST", r"/v1/charges", lambda p, o: st.create_charge(p, o)),
        ("GET", r"/v1/charges", lambda p, o: st.list_of("charge", p, _CHARGE_FILTERS)),
        ("GET", rf"/v1/charges/{_ID}", lambda p, o, i: st.get("charge", i)),
        # The legacy refund endpoints: the first answers the charge, the second the refund.
        ("POST", rf"/v1/charges/{_ID}/refund", lambda p, o, i: st.refund_charge(i, p, o)),
        ("POST", rf"/v1/charges/{_ID}/refunds", lambda p, o, i: st.create_refund(_on(p, i), o)),
        ("GET", rf"/v1/customers/{_ID}", lambda p, o, i: st.get("customer", i)),
        ("DELETE", rf"/v1/customers/{_ID}", lambda p, o, i: st.delete_customer(i, o)),
    ]


def _on(params: Params, charge: str) -> Params:
    """A refund of the charge the path names (naming another in the body is refused)."""
    if params.get("charge", charge) != charge or params.get("payment_intent"):
        raise StripeError(400, "Received unknown parameter: charge", code="parameter_unknown")
    return {**params, "charge": charge}


class Routes:
    """Finds and runs the operation a request names; the caller holds the fake's lock."""

    def __init__(self, state: StripeState) -> None:
        self._routes = [(m, re.compile(rx), op) for m, rx, op in _table(state)]

    def call(self, request: Request, params: Params, origin: dict[str, str | None]) -> StripeObject:
        """The resulting object (a private copy); ``StripeError`` for a refusal or no route."""
        for method, pattern, operation in self._routes:
            match = pattern.fullmatch(request.path)
            if match and method == request.method:
                return copy.deepcopy(operation(params, origin, *match.groups()))
        raise StripeError(
            404,
            f"Unrecognized request URL ({request.method}: {request.path}). "
            "Please see https://stripe.com/docs or we can help at "
            "https://support.stripe.com/.",
        )
