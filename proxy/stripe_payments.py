"""One payment, one effect: the payment a Stripe refund names, whichever alias the agent uses.

A payment is a payment intent and its charge: ``payment_intent=pi_1``, ``charge=ch_1`` (its
charge), ``POST /v1/charges/ch_1/refund`` and ``/v1/charges/ch_1/refunds`` all move money back
from one payment. ``payment_id`` is the payment intent whenever there is one, so all four are
one effect key. A refund that names only a charge is resolved by asking Stripe which payment
intent the charge belongs to (``GET /v1/charges/{id}``, with the agent's own credentials and
account); a legacy charge with no payment intent is its own payment. Nothing is forwarded
when the question cannot be answered.

A refund without ``amount`` refunds whatever remains, an amount that changes with every other
refund: a rule that reads ``amount`` cannot decide it, so such a refund is refused where the
policy's rules for ``stripe.refund`` read ``amount`` (the agent names the amount instead).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from ctrlrun.policy import Policy

from .config import Upstream
from .forward import Forwarder
from .refusals import Refusal
from .routes import Mapped, Request
from .stripe_accounts import needed, own_account
from .stripe_routes import OWN_ACCOUNT

log = logging.getLogger(__name__)

# What the question about a charge carries: who asks, on which account.
_ASKING_HEADERS = ("authorization", "stripe-account")


def reads(policy: Policy, action: str, argument: str) -> bool:
    """Whether a rule of ``action`` has a condition on ``argument``."""
    entry = policy.actions.get(action)
    if entry is None:
        return False
    return any(c.subject == argument for rule in entry.rules for c in rule.conditions)


async def resolve(
    forwarder: Forwarder, up: Upstream, request: Request, route: Mapped, policy: Policy
) -> Mapped | Refusal:
    """``route`` with its account and payment named by their ids, or why it is refused."""
    if route.arguments.get("account") == OWN_ACCOUNT and needed(policy, route.action):
        # No Stripe-Account: the key's own account, by its id (``stripe_accounts``).
        own = await own_account(forwarder, up, request.headers, route.action)
        if isinstance(own, Refusal):
            return own
        route = Mapped(route.action, {**route.arguments, "account": own})
    if route.action != "stripe.refund":
        return route
    args = route.arguments
    if "amount" not in args and reads(policy, route.action, "amount"):
        return Refusal(
            "invalid_request",
            "amount_required",
            "this refund names no amount, so Stripe would refund whatever remains, and the "
            "policy decides refunds on their amount: name the amount",
            action=route.action,
        )
    charge = args.get("charge")
    if not isinstance(charge, str) or "payment_intent" in args:
        return route
    found = await _payment_intent_of(forwarder, up, request.headers, charge)
    if isinstance(found, Refusal):
        return found
    return Mapped(route.action, {**args, "payment_id": found or charge})


async def _payment_intent_of(
    forwarder: Forwarder, up: Upstream, headers: Mapping[str, str], charge: str
) -> str | Refusal | None:
    """The payment intent of ``charge`` (None: a charge of its own), asked of Stripe."""
    asking = [(k, v) for k, v in headers.items() if k in _ASKING_HEADERS]
    reply = await forwarder.send(up, "GET", f"/v1/charges/{quote(charge, safe='')}", asking, b"")
    if reply.status is None or reply.status >= 500 or reply.cut_short:
        return _unanswered(charge, reply.error or f"HTTP {reply.status}")
    if reply.status != 200:
        return Refusal(
            "invalid_request",
            "payment_unresolved",
            f"Stripe answered HTTP {reply.status} when asked which payment the charge "
            f"{charge!r} belongs to, with this request's credentials; nothing was sent",
            action="stripe.refund",
        )
    body = _json(reply.body)
    if not isinstance(body, dict) or body.get("id") != charge:
        return _unanswered(charge, "the answer is not that charge")
    pi = body.get("payment_intent")
    if pi is None or (isinstance(pi, str) and pi):
        return pi
    return _unanswered(charge, "the charge's payment_intent is neither an id nor null")


def _unanswered(charge: str, why: str) -> Refusal:
    log.warning("payment of charge %s unresolved: %s", charge, why)
    return Refusal(
        "unavailable",
        "payment_unresolved",
        f"ctrlrun could not learn which payment the charge {charge!r} belongs to ({why})",
        action="stripe.refund",
    )


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None
