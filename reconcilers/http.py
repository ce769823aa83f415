"""Blocking JSON reads for the reconcilers: every failure is an answer, never an exception.

A reconciler opens one :class:`Reader` per question. Each GET has its own timeout and all of
them share one deadline, so a reconciliation is bounded however many pages it reads. What
comes back is the decoded JSON object, ``Miss.NOT_FOUND`` for a 404, or ``Miss.UNKNOWN`` for
everything that proves nothing: a transport error, a timeout, a redirect, another status, a
body that is not a JSON object. Reconcilers never write, so this module has no other verb.
"""

from __future__ import annotations

import enum
import logging
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Self

import httpx

from ctrlrun.errors import InvalidArgument
from ctrlrun.reconcile import ReconcileOutcome

log = logging.getLogger("ctrlrun.reconcilers")

DEFAULT_TIMEOUT = 5.0  # seconds, per request
DEFAULT_DEADLINE = 30.0  # seconds, for all the requests of one reconciliation

Params = Sequence[tuple[str, str | int]]
Verdict = tuple[ReconcileOutcome, str]  # the answer and why, for the log line


class Miss(enum.Enum):
    """A read that produced no JSON object."""

    NOT_FOUND = "not_found"  # the remote answered 404
    UNKNOWN = "unknown"  # nothing can be concluded from what happened


Reply = dict[str, Any] | Miss


class Reader:
    """GETs JSON objects from one remote until its deadline; use as a context manager."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        ca_file: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        deadline: float = DEFAULT_DEADLINE,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._base = base_url.rstrip("/")
        self._headers = {"Accept": "application/json", **(headers or {})}
        self._timeout = timeout
        self._clock = clock
        self._ends = clock() + deadline
        self._client: httpx.Client | None = None
        try:
            verify: ssl.SSLContext | bool = (
                ssl.create_default_context(cafile=ca_file) if ca_file else True
            )
            self._client = httpx.Client(
                verify=verify, trust_env=False, follow_redirects=False, transport=transport
            )
        except (OSError, ssl.SSLError, ValueError) as exc:
            # An unreadable CA file: every read of this reconciliation answers UNKNOWN.
            log.warning("reconciler cannot reach %s: %s", self._base, type(exc).__name__)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._client is not None:
            self._client.close()

    def get(self, path: str, params: Params = ()) -> Reply:
        """``GET path?params``: the JSON object, ``Miss.NOT_FOUND`` or ``Miss.UNKNOWN``."""
        left = self._ends - self._clock()
        if self._client is None or left <= 0:
            return Miss.UNKNOWN
        try:
            response = self._client.get(
                self._base + path,
                params=list(params),
                headers=self._headers,
                timeout=min(self._timeout, left),
            )
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError, OSError) as exc:
            log.info("reconciler GET %s: %s", path, type(exc).__name__)
            return Miss.UNKNOWN
        if response.status_code == 404:
            return Miss.NOT_FOUND
        if not 200 <= response.status_code < 300:
            log.info("reconciler GET %s: HTTP %d", path, response.status_code)
            return Miss.UNKNOWN
        try:
            body = response.json()
        except ValueError:  # not JSON, or not UTF-8
            log.info("reconciler GET %s: the answer is not JSON", path)
            return Miss.UNKNOWN
        return body if isinstance(body, dict) else Miss.UNKNOWN


def bearer(credentials: Mapping[str, str], fallback: str | None) -> dict[str, str]:
    """The Authorization header: the producing request's own, else ``Bearer <fallback>``."""
    for name, value in credentials.items():
        if name.lower() == "authorization" and value:
            return {"Authorization": value}
    return {"Authorization": f"Bearer {fallback}"} if fallback else {}


def dig(document: Any, dotted: str) -> tuple[Literal[True], Any] | tuple[Literal[False], None]:
    """The value at ``a.b.0.c`` in a JSON document: ``(True, value)``, or ``(False, None)``."""
    node = document
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


class Remote:
    """Where a reconciler asks, how it trusts the answer, and how long it may take."""

    def __init__(
        self,
        base_url: str,
        *,
        ca_file: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        deadline: float = DEFAULT_DEADLINE,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if timeout <= 0 or deadline <= 0:
            raise InvalidArgument("timeout and deadline must be positive")
        self.base_url = base_url.rstrip("/")
        self.ca_file = ca_file
        self.timeout = timeout
        self.deadline = deadline
        self._transport = transport
