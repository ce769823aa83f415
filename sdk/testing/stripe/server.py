"""A fake Stripe (v1) on loopback: refunds, payment intents, payouts, charges, customers, events.

Speaks Stripe's wire format (form bodies with bracket keys, JSON answers, ``Request-Id``),
requires a ``sk_test_`` bearer key (never stored), and honours ``Idempotency-Key`` the way
Stripe does: a stored result is replayed with ``Idempotent-Replayed: true``.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl

from ..messages import Request, Response
from ..server import FakeServer
from .objects import API_VERSION
from .state import StripeState
from .wire import (
    Params,
    StripeError,
    StripeObject,
    injected_error,
    new_id,
    parse_form,
)

IDEMPOTENCY_TTL = 24 * 3600
_KEY = re.compile(r"sk_test_[A-Za-z0-9_]+")
_ID = r"([A-Za-z0-9_]+)"
_REFUND_FILTERS = ("payment_intent", "charge")
_CHARGE_FILTERS = ("customer", "payment_intent")


@dataclass(frozen=True)
class _Stored:
    fingerprint: str
    status: int
    body: bytes
    at: float


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
        super().__init__(host, port, tls=tls, hang_seconds=hang_seconds)
        self._state = StripeState(clock)
        self._idempotency: dict[str, _Stored] = {}
        st = self._state
        routes: list[tuple[str, str, Callable[..., StripeObject]]] = [
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
            ("GET", rf"/v1/customers/{_ID}", lambda p, o, i: st.get("customer", i)),
            ("DELETE", rf"/v1/customers/{_ID}", lambda p, o, i: st.delete_customer(i, o)),
        ]
        self._routes = [(m, re.compile(rx), fn) for m, rx, fn in routes]

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
    ) -> StripeObject:
        """Seed a payment intent (with a ``ch_`` charge when succeeded or requires_capture)."""
        with self._lock:
            pi = self._state.add_payment_intent(
                id, amount, currency, status, metadata or {}, created
            )
            return copy.deepcopy(pi)

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
        """Every refund, oldest first."""
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
        scheme, _, credential = request.header("authorization").partition(" ")
        if scheme.lower() == "basic":
            try:
                credential = base64.b64decode(credential).decode().partition(":")[0]
            except ValueError:
                credential = ""
        elif scheme.lower() != "bearer":
            credential = ""
        if _KEY.fullmatch(credential.strip()):
            return None
        message = (
            "Invalid API Key provided (the fake accepts sk_test_ keys only)."
            if credential
            else "You did not provide an API key. You need to provide your API key in the "
            "Authorization header, using Bearer auth (e.g. 'Authorization: Bearer "
            "YOUR_SECRET_KEY')."
        )
        return _error(StripeError(401, message))

    def handle(self, request: Request) -> Response:
        request_id = new_id("req_")
        key = request.header("idempotency-key") if request.method == "POST" else ""
        params = parse_form(request.query if request.method == "GET" else _form(request))
        fingerprint = _fingerprint(request, params)
        with self._lock:
            stored = self._stored(key)
            if stored is not None:
                if stored.fingerprint != fingerprint:
                    return _error(
                        StripeError(
                            400,
                            "Keys for idempotent requests can only be used with the same "
                            f"parameters they were first used with. Try using a key other than "
                            f"'{key}' if you meant to execute a different request.",
                            error_type="idempotency_error",
                        )
                    )
                return Response(
                    stored.status,
                    stored.body,
                    {"Content-Type": "application/json", "Idempotent-Replayed": "true"},
                )
            try:
                obj = self._route(
                    request, params, {"id": request_id, "idempotency_key": key or None}
                )
            except StripeError as exc:
                response = _error(exc)
                if exc.stored:
                    self._store(key, fingerprint, response)
            else:
                response = Response.json(200, obj)
                if request.is_write:
                    self._applied()
                self._store(key, fingerprint, response)
        response.headers["Request-Id"] = request_id
        return response

    def error_response(
        self, request: Request, status: int, *, applied: Response | None
    ) -> Response:
        response = _error(injected_error(status))
        key = request.header("idempotency-key") if request.method == "POST" else ""
        replayed = applied is not None and "Idempotent-Replayed" in applied.headers
        # Stripe stores whatever the endpoint answered once it began executing, 5xx included;
        # 400/404/408/409/429 here stand for refusals in front of the idempotency layer.
        if key and not replayed and (status >= 500 or status in (402, 424)):
            with self._lock:
                if applied is not None or self._stored(key) is None:
                    fingerprint = _fingerprint(request, parse_form(_form(request)))
                    self._store(key, fingerprint, response)
        return response

    def finalize(self, request: Request, response: Response) -> Response:
        response.headers.setdefault("Request-Id", new_id("req_"))
        response.headers.setdefault(
            "Stripe-Version", request.header("stripe-version") or API_VERSION
        )
        return response

    def _stored(self, key: str) -> _Stored | None:
        stored = self._idempotency.get(key) if key else None
        if stored is not None and self._state.clock() - stored.at > IDEMPOTENCY_TTL:
            return None
        return stored

    def _store(self, key: str, fingerprint: str, response: Response) -> None:
        if key:
            self._idempotency[key] = _Stored(
                fingerprint, response.status, response.body, self._state.clock()
            )

    def _route(
        self, request: Request, params: Params, origin: dict[str, str | None]
    ) -> StripeObject:
        for method, pattern, handler in self._routes:
            match = pattern.fullmatch(request.path)
            if match and method == request.method:
                return copy.deepcopy(handler(params, origin, *match.groups()))
        raise StripeError(
            404,
            f"Unrecognized request URL ({request.method}: {request.path}). "
            "Please see https://stripe.com/docs or we can help at "
            "https://support.stripe.com/.",
        )


def _form(request: Request) -> list[tuple[str, str]]:
    try:
        return parse_qsl(request.body.decode(), keep_blank_values=True)
    except UnicodeDecodeError:
        return []


def _fingerprint(request: Request, params: Params) -> str:
    """What "the same request" means for an idempotency key: endpoint and parameters."""
    return json.dumps([request.method, request.path, params], sort_keys=True)


def _error(exc: StripeError) -> Response:
    return Response.json(exc.status, exc.body)
