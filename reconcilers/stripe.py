"""What really happened to an ambiguous Stripe write, asked of Stripe with GETs only.

=============================  ============================================================
action                         answer
=============================  ============================================================
stripe.refund                  committed: a ``refund.created`` event carries the attempt's
                               ``Idempotency-Key``, or exactly one refund of the payment
                               created since the attempt (less 5 s) matches by amount;
                               not_executed: the complete list holds no such refund
                               (and, where ``account`` is ``self``, the payment is on
                               the account of the key asked with, or it proves nothing)
stripe.cancel_payment_intent   the payment intent's ``status`` is (not) ``canceled``
stripe.delete_customer         the customer is (not) ``deleted``
stripe.payout                  committed: a ``payout.created`` event carries the key
=============================  ============================================================

Everything else, and everything unproven (unreachable, 5xx, two refunds of the same amount,
a list longer than the page bound, a list holding another payment's refund, an object whose
``id`` is not the one asked about), is ``unknown``. So is every answer judged on a time
(``created``) while Stripe's clock is not known to be within ``MAX_SKEW`` of the ledger's: each
answer's ``Date`` measures it. And no answer is ``not_executed`` inside the attempt's settle
window (``http.settled_at``): Stripe may still be working on a write whose sender gave up.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx

from ctrlrun.clocks import utc_now
from ctrlrun.context import idempotency_token_for
from ctrlrun.errors import InvalidArgument
from ctrlrun.reconcile import ReconcileOutcome, evidenced

from .base import EffectFacts
from .http import (
    DEFAULT_DEADLINE,
    DEFAULT_TIMEOUT,
    SETTLE_MARGIN,
    Miss,
    Params,
    Reader,
    Remote,
    Verdict,
    bearer,
)

log = logging.getLogger(__name__)

STRIPE_API = "https://api.stripe.com"
SKEW_SECONDS = 5  # the look-back: Stripe's ``created`` is whole seconds, and clocks differ
# Stripe's clock may be this far from the ledger's (measured by the answers' ``Date``, whole
# seconds) for a time-based answer to stand; past it, or unmeasured, the answer is unknown.
MAX_SKEW = 3.0
MAX_PAGES = 50  # of 100 objects each
_CHARGE_PREFIXES = ("ch_", "py_")

Page = tuple[list[dict[str, Any]], bool]  # the objects read, and whether the list is complete


@dataclass(frozen=True)
class StripeTarget:
    """Where a Stripe reconciler asks, with which key, and how long a forwarded write may run."""

    base_url: str = STRIPE_API
    api_key_env: str | None = None  # the variable's name; its value is read when asked
    ca_file: str | None = None
    # The deadline of the forwarded write: Stripe may keep working on it that long, so an empty
    # list proves nothing before then.
    timeout: float = 30.0


class StripeReconciler(Remote):
    """Answers for one Stripe upstream (see the module docstring for the table)."""

    def __init__(
        self,
        base_url: str = STRIPE_API,
        *,
        api_key: str | None = None,
        api_key_env: str | None = None,
        ca_file: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        deadline: float = DEFAULT_DEADLINE,
        max_pages: int = MAX_PAGES,
        write_timeout: float = 0.0,
        settle_margin: float = 0.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if max_pages < 1:
            raise InvalidArgument("max_pages must be at least 1")
        super().__init__(
            base_url,
            ca_file=ca_file,
            timeout=timeout,
            deadline=deadline,
            transport=transport,
            write_timeout=write_timeout,
            settle_margin=settle_margin,
        )
        self.max_pages = max_pages
        self._api_key = api_key
        self._api_key_env = api_key_env  # read when asked, so the key is not kept here

    @classmethod
    def for_target(cls, target: StripeTarget) -> StripeReconciler:
        return cls(
            target.base_url,
            api_key_env=target.api_key_env,
            ca_file=target.ca_file,
            write_timeout=target.timeout,
            settle_margin=SETTLE_MARGIN,
        )

    def __call__(self, facts: EffectFacts) -> ReconcileOutcome:
        try:
            key = facts.idempotency_key or idempotency_token_for(facts.effect_key, facts.attempt)
        except InvalidArgument:
            key = None
        return self.answer(
            facts.action,
            facts.arguments,
            started_at=facts.attempt_started_at,
            idempotency_keys=[key] if key else [],
            credentials=facts.credentials,
            effect_key=facts.effect_key,
            facts=facts,
        )

    def answer(
        self,
        action: str,
        arguments: Mapping[str, Any],
        *,
        started_at: datetime,
        idempotency_keys: Collection[str] = (),
        credentials: Mapping[str, str] | None = None,
        effect_key: str = "",
        facts: EffectFacts | None = None,
    ) -> ReconcileOutcome:
        """Ask about one write; any of ``idempotency_keys`` identifies it in Stripe's events.

        With ``facts`` (the attempt's), its settle window applies and Stripe's clock is measured
        against the ledger's (``facts.clock``); without, against this host's.
        """
        ask: dict[str, Callable[[Reader, Mapping[str, Any], int, Collection[str]], Verdict]] = {
            "stripe.refund": self._refund,
            "stripe.cancel_payment_intent": _cancel,
            "stripe.delete_customer": _delete_customer,
            "stripe.payout": self._payout,
        }
        how = ask.get(action)
        verdict: Verdict = ("unknown", "no Stripe reconciler for this action")
        if how is not None:
            with Reader(
                self.base_url,
                headers=self._headers(credentials or {}, arguments.get("account")),
                ca_file=self.ca_file,
                timeout=self.timeout,
                deadline=self.deadline,
                transport=self._transport,
                wall=utc_now if facts is None else facts.clock,
            ) as reader:
                verdict = how(reader, arguments, _since(started_at), idempotency_keys)
                unsure = action == "stripe.refund" and _unsure_of_account(arguments)
                if verdict[0] == "not_executed" and unsure:
                    verdict = _on_this_account(reader, arguments, verdict)
        if facts is not None:
            verdict = self.settle(verdict, facts)
        log.info("reconcile %s %s: %s (%s)", action, effect_key, *verdict)
        return evidenced(*verdict)

    # -- the questions -----------------------------------------------------------------------

    def _refund(
        self, reader: Reader, args: Mapping[str, Any], since: int, keys: Collection[str]
    ) -> Verdict:
        target = _payment(args)
        amount = _int(args.get("amount"))
        if target is None or (args.get("amount") is not None and amount is None):
            return "unknown", "no payment_intent/charge (or a bad amount) among the arguments"
        field, payment = target
        listed = self._scan(reader, "/v1/refunds", [(field, payment)], since)
        if not isinstance(listed, Miss) and any(r.get(field) != payment for r in listed[0]):
            # A list that did not apply its filter (a proxy dropped the query, another API
            # answered) says nothing about this payment's refunds, by amount or by absence.
            listed = Miss.UNKNOWN
        refunds, complete = ([], False) if isinstance(listed, Miss) else listed
        recent = [r for r in refunds if _since_ok(r, since)]
        if complete and not recent:
            return _timed(reader, ("not_executed", "no refund of the payment since the attempt"))

        # Some refund exists (or the list is unreadable): was one of them made with the key?
        def ours(event: dict[str, Any]) -> bool:
            refund = _event_object(event, keys)
            return refund is not None and refund.get(field) == payment

        kind = [("type", "refund.created")]
        events = self._scan(reader, "/v1/events", kind, since, ours) if keys else Miss.UNKNOWN
        if not isinstance(events, Miss) and any(ours(e) for e in events[0]):
            return "committed", "a refund.created event carries the attempt's Idempotency-Key"
        if isinstance(listed, Miss):
            return "unknown", "the refunds could not be listed"
        matches = [r for r in recent if amount is None or r.get("amount") == amount]
        if len(matches) > 1:
            return "unknown", f"{len(matches)} refunds since the attempt match by amount"
        if not complete:
            return "unknown", f"more than {self.max_pages} pages of refunds to read"
        if matches:
            return _timed(reader, ("committed", "one refund since the attempt matches by amount"))
        return _timed(
            reader, ("not_executed", "no refund of the payment since the attempt matches by amount")
        )

    def _payout(
        self, reader: Reader, args: Mapping[str, Any], since: int, keys: Collection[str]
    ) -> Verdict:
        def ours(event: dict[str, Any]) -> bool:
            return _event_object(event, keys) is not None

        events = self._scan(reader, "/v1/events", [("type", "payout.created")], since, ours)
        if not isinstance(events, Miss) and any(ours(e) for e in events[0]):
            return "committed", "a payout.created event carries the attempt's Idempotency-Key"
        return "unknown", "payouts are identified by the Idempotency-Key only"

    def _scan(
        self,
        reader: Reader,
        path: str,
        params: Params,
        since: int,
        stop: Callable[[dict[str, Any]], bool] | None = None,
    ) -> Page | Miss:
        """Read a list (newest first) created since ``since``, until ``stop`` holds for one."""
        found: list[dict[str, Any]] = []
        after: str | None = None
        for _ in range(self.max_pages):
            page_params = [*params, ("created[gte]", since), ("limit", 100)]
            if after is not None:
                page_params.append(("starting_after", after))
            page = reader.get(path, page_params)
            if isinstance(page, Miss):
                return Miss.UNKNOWN
            data, more = page.get("data"), page.get("has_more")
            if not isinstance(data, list) or not isinstance(more, bool):
                return Miss.UNKNOWN
            if not all(isinstance(o, dict) and isinstance(o.get("id"), str) for o in data):
                return Miss.UNKNOWN
            found.extend(data)
            if not more or (stop is not None and any(stop(o) for o in data)):
                return found, not more
            if not data:
                return Miss.UNKNOWN  # has_more with an empty page: no cursor to go on with
            after = data[-1]["id"]
        return found, False

    def _headers(self, credentials: Mapping[str, str], account: Any) -> dict[str, str]:
        key = self._api_key or (os.environ.get(self._api_key_env) if self._api_key_env else None)
        headers = bearer(credentials, key)
        for name, value in credentials.items():
            if name.lower() == "stripe-account" and value:  # a Connect account's objects
                headers["Stripe-Account"] = value
        if isinstance(account, str) and account.startswith("acct_"):
            # The action's own account (the proxy's ``account``): a sweep after a restart has
            # no request headers, and asking the platform about a connected account's refund
            # would find nothing there.
            headers["Stripe-Account"] = account
        return headers


def _timed(reader: Reader, verdict: Verdict) -> Verdict:
    """A verdict that rests on ``created`` stands only while Stripe's clock is known to agree
    with the ledger's (a sidecar 30 s ahead would look past the refund it is asked about)."""
    if reader.skew is not None and reader.skew <= MAX_SKEW:
        return verdict
    measured = "unmeasured" if reader.skew is None else f"up to {reader.skew:.0f} s"
    return "unknown", f"{verdict[1]}, but Stripe's clock is {measured} from the ledger's"


def _cancel(reader: Reader, args: Mapping[str, Any], since: int, keys: Collection[str]) -> Verdict:
    pi = args.get("payment_intent") or args.get("payment_id")
    if not isinstance(pi, str) or not pi:
        return "unknown", "no payment_intent among the arguments"
    reply = reader.get(f"/v1/payment_intents/{quote(pi, safe='')}")
    if isinstance(reply, Miss):
        return "unknown", f"the payment intent could not be read ({reply.value})"
    if reply.get("id") != pi:  # an error in a 200, a list, another object: not this one
        return "unknown", "the answer is not that payment intent"
    status = reply.get("status")
    if status == "canceled":
        return "committed", "the payment intent is canceled"
    if isinstance(status, str):
        return "not_executed", f"the payment intent is {status}"
    return "unknown", "the payment intent has no status"


def _delete_customer(
    reader: Reader, args: Mapping[str, Any], since: int, keys: Collection[str]
) -> Verdict:
    customer = args.get("customer")
    if not isinstance(customer, str) or not customer:
        return "unknown", "no customer among the arguments"
    reply = reader.get(f"/v1/customers/{quote(customer, safe='')}")
    if isinstance(reply, Miss):
        return "unknown", f"the customer could not be read ({reply.value})"
    if reply.get("id") != customer:  # ``{}``, an error in a 200, a list: no customer at all
        return "unknown", "the answer is not that customer"
    if reply.get("deleted") is True:
        return "committed", "the customer is deleted"
    return "not_executed", "the customer exists"


def _event_object(event: dict[str, Any], keys: Collection[str]) -> dict[str, Any] | None:
    """The event's object when the request that caused it carried one of ``keys``."""
    request, data = event.get("request"), event.get("data")
    if not isinstance(request, dict) or request.get("idempotency_key") not in keys:
        return None
    obj = data.get("object") if isinstance(data, dict) else None
    return obj if isinstance(obj, dict) else None


def _unsure_of_account(args: Mapping[str, Any]) -> bool:
    """Whether the account asked may not be the one the write acted on: with no account id
    to name (``self``), the key asked with acts on its own, and that is another account's
    whenever the retry, the sweep or the hook brought another key than the attempt's (a
    connected account's own key refunded, the platform's key asks)."""
    account = args.get("account")
    return not (isinstance(account, str) and account.startswith("acct_"))


def _on_this_account(reader: Reader, args: Mapping[str, Any], verdict: Verdict) -> Verdict:
    """``verdict`` (no refund here) only if the payment itself is on the account asked: a
    connected account's payment refunded with that account's own key is not on the platform's,
    and its refund is not either."""
    target = _payment(args)
    if target is None:
        return "unknown", "no payment among the arguments"
    field, payment = target
    kind = "payment_intents" if field == "payment_intent" else "charges"
    found = reader.get(f"/v1/{kind}/{quote(payment, safe='')}")
    if isinstance(found, dict) and found.get("id") == payment:
        return verdict
    return "unknown", "the payment is not on the account this key acts on: another key's refund"


def _payment(args: Mapping[str, Any]) -> tuple[str, str] | None:
    """Which list filter finds the refund: ``("payment_intent", id)`` or ``("charge", id)``."""
    for field in ("payment_intent", "charge"):
        value = args.get(field)
        if isinstance(value, str) and value:
            return field, value
    value = args.get("payment_id")
    if isinstance(value, str) and value.startswith("pi_"):
        return "payment_intent", value
    if isinstance(value, str) and value.startswith(_CHARGE_PREFIXES):
        return "charge", value
    return None  # an id of no known shape: a wrong filter would list nothing, proving nothing


def _int(value: Any) -> int | None:
    """An integer (a string of digits too); None for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


def _since_ok(obj: dict[str, Any], since: int) -> bool:
    created = _int(obj.get("created"))
    return created is not None and created >= since


def _since(started_at: datetime) -> int:
    """The earliest ``created`` the attempt's object can carry, in whole seconds."""
    aware = started_at if started_at.tzinfo else started_at.replace(tzinfo=UTC)
    return math.floor(aware.timestamp()) - SKEW_SECONDS
