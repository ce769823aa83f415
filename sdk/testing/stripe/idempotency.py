"""Stripe's idempotency layer: the first result under a key is replayed for 24 hours.

A replay carries ``Idempotent-Replayed: true``; the same key with other parameters is an
``idempotency_error``. What "the same request" means is the endpoint and its parameters.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from ..messages import Request, Response
from .wire import Params, StripeError

IDEMPOTENCY_TTL = 24 * 3600


@dataclass(frozen=True)
class Stored:
    """The answer first given under one key (never the request's credentials)."""

    fingerprint: str
    status: int
    body: bytes
    at: float


class Idempotency:
    """Stored answers by ``Idempotency-Key``; the caller holds the fake's lock."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._stored: dict[str, Stored] = {}

    def has(self, key: str) -> bool:
        return self._get(key) is not None

    def replay(self, key: str, fingerprint: str) -> Response | None:
        """The stored answer for ``key``, an idempotency error for other parameters, or None."""
        stored = self._get(key)
        if stored is None:
            return None
        if stored.fingerprint != fingerprint:
            error = mismatch(key)
            return Response.json(error.status, error.body)
        headers = {"Content-Type": "application/json", "Idempotent-Replayed": "true"}
        return Response(stored.status, stored.body, headers)

    def store(self, key: str, fingerprint: str, response: Response) -> None:
        if key:
            self._stored[key] = Stored(fingerprint, response.status, response.body, self._clock())

    def _get(self, key: str) -> Stored | None:
        stored = self._stored.get(key) if key else None
        if stored is not None and self._clock() - stored.at > IDEMPOTENCY_TTL:
            return None
        return stored


def idempotency_key(request: Request) -> str:
    """The request's key; Stripe honours one on POST only."""
    return request.header("idempotency-key") if request.method == "POST" else ""


def fingerprint(request: Request, params: Params) -> str:
    return json.dumps([request.method, request.path, params], sort_keys=True)


def mismatch(key: str) -> StripeError:
    return StripeError(
        400,
        "Keys for idempotent requests can only be used with the same parameters they were "
        f"first used with. Try using a key other than '{key}' if you meant to execute a "
        "different request.",
        error_type="idempotency_error",
    )
