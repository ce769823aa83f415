"""A fake Stripe (v1) on loopback: refunds, payment intents, payouts, charges, customers, events.

Speaks Stripe's wire format (form bodies with bracket keys, JSON answers, ``Request-Id``),
requires a ``sk_test_`` bearer key (never stored), and honours ``Idempotency-Key`` the way
Stripe does: a stored result is replayed with ``Idempotent-Replayed: true``; a request refused
in front of that layer (401, 429, an unknown ``Stripe-Account``) stores nothing. Connected
accounts (``add_account``) hold their own objects and keys (``accounts.py``).
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable, Mapping
from email.utils import formatdate
from urllib.parse import parse_qsl

from ..connection import Answer
from ..messages import Request, Response
from ..server import FakeServer
from . import objects
from .accounts import PLATFORM, Accounts, api_key
from .idempotency import fingerprint, idempotency_key
from .objects import API_VERSION
from .state import StripeState
from .wire import StripeError, StripeObject, injected_error, new_id, parse_form

_KEY = re.compile(r"sk_test_[A-Za-z0-9_]+")


class FakeStripe(FakeServer):
    """A fake Stripe API server; see the module docstring and :class:`FakeServer`."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        tls: bool = False,
        hang_seconds: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``clock`` is the fake's own (epoch seconds): give it an offset to stand for a Stripe
        whose clock differs from the ledger's."""
        super().__init__(host, port, tls=tls, hang_seconds=hang_seconds)
        self._clock = clock  # its objects' ``created`` and every answer's ``Date``
        self._accounts = Accounts(clock)
        self._running: set[tuple[str, str]] = set()  # (account, key) of requests running now

    @property
    def _state(self) -> StripeState:
        return self._accounts.get(PLATFORM).state

    # -- seeding and inspection (any thread) -------------------------------------------------

    def add_payment_intent(
        self,
        id: str | None = None,
        amount: int = 10_000,
        *,
        currency: str = "usd",
        status: str = "succeeded",
        metadata: Mapping[str, str] | None = None,
        created: int | None = None,
        account: str | None = None,
    ) -> StripeObject:
        """Seed a payment intent (with a ``ch_`` charge when succeeded or requires_capture),
        on the platform's account or the connected ``account``."""
        with self._lock:
            pi = self._accounts.get(account).state.add_payment_intent(
                id, amount, currency, status, metadata or {}, created
            )
            return copy.deepcopy(pi)

    def add_charge(
        self, amount: int = 10_000, *, currency: str = "usd", account: str | None = None
    ) -> StripeObject:
        """Seed a charge of its own (a legacy direct charge: no payment intent)."""
        with self._lock:
            state = self._accounts.get(account).state
            charge = objects.charge(amount, currency, state.now())
            state.charges[charge["id"]] = charge
            return copy.deepcopy(charge)

    def add_account(self, id: str | None = None, *, key: str | None = None) -> str:
        """Connect an account that requests may name in ``Stripe-Account``; returns its id.
        ``key``: the account's own secret key, which acts on it with no header."""
        with self._lock:
            return self._accounts.add(id, key=key)

    @property
    def platform_id(self) -> str:
        """The platform's own account id (what ``GET /v1/account`` answers for its keys)."""
        return self._accounts.platform_id

    def refunds_in(self, account: str | None) -> list[StripeObject]:
        """Every refund of the connected ``account`` (None: the platform's), oldest first."""
        with self._lock:
            return copy.deepcopy(list(self._accounts.get(account).state.refunds.values()))

    def add_customer(
        self, id: str | None = None, *, email: str | None = None, name: str | None = None
    ) -> StripeObject:
        with self._lock:
            return copy.deepcopy(self._state.add_customer(id, email, name))

    def add_refund(
        self,
        *,
        payment_intent: str | None = None,
        charge: str | None = None,
        amount: int,
        created: int | None = None,
        idempotency_key: str | None = None,
        reason: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> StripeObject:
        """Create a refund directly (no request, no over-refund check), with its event."""
        with self._lock:
            if charge is None:
                pi = self._get("payment_intent", str(payment_intent))
                if not pi["latest_charge"]:
                    raise ValueError(f"payment intent {payment_intent} has no charge to refund")
                charge = str(pi["latest_charge"])
            target = self._get("charge", charge)
            when = self._state.now() if created is None else created
            request = {"id": new_id("req_"), "idempotency_key": idempotency_key}
            refund = self._state.insert_refund(
                target, amount, when, reason, metadata or {}, request
            )
            return copy.deepcopy(refund)

    @property
    def refunds(self) -> list[StripeObject]:
        """Every refund of the platform's own account, oldest first."""
        with self._lock:
            return copy.deepcopy(list(self._state.refunds.values()))

    @property
    def events(self) -> list[StripeObject]:
        with self._lock:
            return copy.deepcopy(list(self._state.events.values()))

    @property
    def payouts(self) -> list[StripeObject]:
        with self._lock:
            return copy.deepcopy(list(self._state.payouts.values()))

    def payment_intent(self, id: str) -> StripeObject:
        with self._lock:
            return copy.deepcopy(self._get("payment_intent", id))

    def charge(self, id: str) -> StripeObject:
        with self._lock:
            return copy.deepcopy(self._get("charge", id))

    def customer(self, id: str) -> StripeObject:
        with self._lock:
            return copy.deepcopy(self._get("customer", id))

    def _get(self, kind: str, object_id: str) -> StripeObject:
        try:
            return self._state.get(kind, object_id)
        except StripeError as exc:
            raise KeyError(str(exc)) from exc

    # -- the HTTP side (server thread) ---------------------------------------------------------

    def authorize(self, request: Request) -> Response | None:
        credential = api_key(request)
        if _KEY.fullmatch(credential):
            return None
        message = (
            "Invalid API Key provided (the fake accepts sk_test_ keys only)."
            if credential
            else "You did not provide an API key. You need to provide your API key in the "
            "Authorization header, using Bearer auth (e.g. 'Authorization: Bearer "
            "YOUR_SECRET_KEY')."
        )
        return _error(StripeError(401, message))

    async def _answer(self, request: Request) -> Answer:
        """Stripe's concurrency guard: a key whose first request is still running is answered
        409 ``idempotency_key_in_use`` (and nothing stored); the first goes on, and finishes."""
        key = idempotency_key(request)
        if not key or self.authorize(request) is not None:
            return await super()._answer(request)
        with self._lock:
            try:
                scope = (self._accounts.of(request).id, key)
            except StripeError:
                scope = None  # refused in handle(), before anything runs
            busy = scope in self._running
            if busy:
                self._requests.append((request.method, request.path))
            elif scope is not None:
                self._running.add(scope)
        if busy:
            return self.finalize(request, _error(injected_error(409)))
        try:
            return await super()._answer(request)
        finally:
            if scope is not None:
                with self._lock:
                    self._running.discard(scope)

    def handle(self, request: Request) -> Response:
        request_id = new_id("req_")
        key = idempotency_key(request)
        params = parse_form(request.query if request.method == "GET" else _form(request))
        same = fingerprint(request, params)
        with self._lock:
            try:
                account = self._accounts.of(request)
            except StripeError as exc:  # refused before the idempotency layer: nothing stored
                return _error(exc)
            replay = account.idempotency.replay(key, same)
            if replay is not None:
                return replay
            if (request.method, request.path) == ("GET", "/v1/account"):
                response = Response.json(200, objects.account(account.id))
                response.headers["Request-Id"] = request_id
                return response
            origin = {"id": request_id, "idempotency_key": key or None}
            try:
                obj = account.routes.call(request, params, origin)
            except StripeError as exc:
                response = _error(exc)
                if exc.stored:
                    account.idempotency.store(key, same, response)
            else:
                response = Response.json(200, obj)
                if request.is_write:
                    self._applied()
                account.idempotency.store(key, same, response)
        response.headers["Request-Id"] = request_id
        return response

    def error_response(
        self, request: Request, status: int, *, applied: Response | None
    ) -> Response:
        response = _error(injected_error(status))
        key = idempotency_key(request)
        replayed = applied is not None and "Idempotent-Replayed" in applied.headers
        # Stripe stores whatever the endpoint answered once it began executing, 5xx included;
        # 400/404/408/409/429 here stand for refusals in front of the idempotency layer.
        if key and not replayed and (status >= 500 or status in (402, 424)):
            with self._lock:
                try:
                    idempotency = self._accounts.of(request).idempotency
                except StripeError:
                    return response  # no such account: nothing began, nothing stored
                if applied is not None or not idempotency.has(key):
                    same = fingerprint(request, parse_form(_form(request)))
                    idempotency.store(key, same, response)
        return response

    def finalize(self, request: Request, response: Response) -> Response:
        response.headers.setdefault("Request-Id", new_id("req_"))
        response.headers.setdefault("Date", formatdate(self._clock(), usegmt=True))
        response.headers.setdefault(
            "Stripe-Version", request.header("stripe-version") or API_VERSION
        )
        return response


def _form(request: Request) -> list[tuple[str, str]]:
    try:
        return parse_qsl(request.body.decode(), keep_blank_values=True)
    except UnicodeDecodeError:
        return []


def _error(exc: StripeError) -> Response:
    return Response.json(exc.status, exc.body)
