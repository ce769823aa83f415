"""Blocking JSON reads for the reconcilers: every failure is an answer, never an exception.

A reconciler opens one :class:`Reader` per question. Each GET has its own timeout and all of
them share one deadline, so a reconciliation is bounded however many pages it reads. What
comes back is the decoded JSON object, ``Miss.NOT_FOUND`` for a 404, or ``Miss.UNKNOWN`` for
everything that proves nothing: a transport error, a timeout, a redirect, another status, a
body that is not a JSON object. Reconcilers never write, so this module has no other verb.
"""

from __future__ import annotations

import enum
import json
import logging
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any, Literal, Self

import httpx

from ctrlrun import steady
from ctrlrun.errors import InvalidArgument
from ctrlrun.reconcile import EffectFacts, ReconcileOutcome

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 5.0  # seconds, per request
DEFAULT_DEADLINE = 30.0  # seconds, for all the requests of one reconciliation
MAX_BODY = 16 * 1024 * 1024  # bytes of one answer (a page of 100 Stripe objects is far less)
# How long a remote may go on applying a write after its sender gave up on it (Stripe, and an
# apiserver's own request timeout, are about a minute): the margin of every settle window.
SETTLE_MARGIN = 60.0

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
        wall: Callable[[], datetime] | None = None,
    ) -> None:
        self._base = base_url.rstrip("/")
        # With ``wall`` (the ledger's clock), each answer's ``Date`` measures the remote's
        # clock against it: ``skew`` is the worst difference seen, None while unknown.
        self._wall = wall
        self.skew: float | None = None
        self.missing: dict[str, Any] | None = None  # the JSON body of the last 404, if any
        self.ahead: timedelta | None = None  # the ledger's clock less the remote's (``_measure``)
        self._dated = True
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
        sent = self._wall() if self._wall is not None else None
        try:
            # httpx's ``params=`` replaces a URL's own query (an empty list drops it): a
            # declarative ``get: /v1/invoices?number={id}`` would list every invoice.
            url = httpx.URL(self._base + path)
            if params:
                url = url.copy_merge_params(list(params))
            with self._client.stream(
                "GET",
                url,
                headers=self._headers,
                timeout=min(self._timeout, left),
            ) as response:
                if sent is not None and self._wall is not None:
                    self._measure(sent, self._wall(), response.headers.get("date"))
                status = response.status_code
                body = self._body(response, path) if status == 404 or 200 <= status < 300 else b""
        except (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError, OSError) as exc:
            log.info("reconciler GET %s: %s", path, type(exc).__name__)
            return Miss.UNKNOWN
        if body is None:
            return Miss.UNKNOWN
        if status == 404:
            # Whose 404 it is (the remote's own word about the object, or an ingress's page)
            # is in the body: kept for the reconciler to judge.
            self.missing = _json_object(body)
            return Miss.NOT_FOUND
        if not 200 <= status < 300:
            log.info("reconciler GET %s: HTTP %d", path, status)
            return Miss.UNKNOWN
        document = _json_object(body)
        if document is None:
            log.info("reconciler GET %s: the answer is no JSON object", path)
        return Miss.UNKNOWN if document is None else document

    def _body(self, response: httpx.Response, path: str) -> bytes | None:
        """The whole body, or None once it passes ``MAX_BODY`` or the deadline: httpx's
        timeout bounds each read, so a remote trickling bytes would hold us past it."""
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > MAX_BODY or self._clock() > self._ends:
                log.info("reconciler GET %s: the body ran past its bound", path)
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    def _measure(self, sent: datetime, received: datetime, date: str | None) -> None:
        """Widen ``skew`` by one answer: its ``Date`` (whole seconds) was stamped between
        ``sent`` and ``received`` on our clock. An answer with no usable Date: unknown."""
        remote = _http_date(date)
        # The last answer's latest ledger time for a remote time t is t + ``ahead`` (+1 s for
        # the Date's truncation): how a reconciler places the remote's own timestamps.
        self.ahead = None if remote is None else received - remote
        if remote is None or not self._dated:
            self._dated, self.skew = False, None
            return
        early = (sent - remote - timedelta(seconds=1)).total_seconds()
        late = (received - remote).total_seconds()
        worst = max(abs(early), abs(late))
        self.skew = worst if self.skew is None else max(self.skew, worst)


def _json_object(content: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(content)
    except ValueError:  # not JSON, or not UTF-8 (-16, -32)
        return None
    return body if isinstance(body, dict) else None


def _http_date(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


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
        write_timeout: float = 0.0,
        settle_margin: float = 0.0,
    ) -> None:
        if timeout <= 0 or deadline <= 0:
            raise InvalidArgument("timeout and deadline must be positive")
        if write_timeout < 0 or settle_margin < 0:
            raise InvalidArgument("write_timeout and settle_margin must not be negative")
        self.base_url = base_url.rstrip("/")
        self.ca_file = ca_file
        self.timeout = timeout
        self.deadline = deadline
        self._transport = transport
        self.write_timeout = write_timeout  # the deadline the write was forwarded under
        self.settle_margin = settle_margin

    def __repr__(self) -> str:
        """The class and where it asks: never a token or an API key."""
        return f"{type(self).__name__}({self.base_url!r})"

    def settle(self, verdict: Verdict, facts: EffectFacts) -> Verdict:
        """No ``not_executed`` while the attempt could still be applied (``settled_at``)."""
        if verdict[0] != "not_executed":
            return verdict
        until = settled_at(facts, self.write_timeout, self.settle_margin)
        # The ledger's clock, and this process's monotonic one where it stamped the attempt:
        # a step of the wall clock since then must not end the window early (``steady``).
        wait = max(
            (until - facts.clock()).total_seconds(),
            steady.still_to_wait(facts.effect_key, facts.attempt, until),
        )
        if wait <= 0:
            return verdict
        return (
            "unknown",
            f"{verdict[1]}, but the write may still be applied for {wait:.0f} s more "
            "(its settle window)",
        )


def settled_at(facts: EffectFacts, write_timeout: float, margin: float) -> datetime:
    """When "nothing there" starts to prove the attempt did nothing, on the ledger's clock.

    A write forwarded under a deadline (the proxy's) may have left until its start plus that
    deadline; one with no deadline (an SDK function, ``write_timeout=0``) until it was recorded
    ambiguous (it gave up, or its lease ran out). The remote may go on applying it for
    ``margin`` after that.
    """
    last = _aware(facts.attempt_started_at) + timedelta(seconds=write_timeout)
    if write_timeout <= 0 and facts.ended_at is not None:
        last = max(last, _aware(facts.ended_at))
    return last + timedelta(seconds=margin)


def _aware(ts: datetime) -> datetime:
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)
