"""The reconciler a ``profile: http`` route declares: one GET and two JSON conditions.

    routes:
      - method: POST
        path: /v1/invoices/{invoice_id}/send
        action: billing.send_invoice
        reconcile:
          get: /v1/invoices/{invoice_id}
          committed: {status: sent}
          not_executed: {status: draft}

The ``get`` template is filled from the effect's arguments. A condition maps dotted paths
into the JSON answer (``data.0.status``) to values; a value that is exactly ``"{name}"``
stands for that argument. Every pair must hold. ``committed`` when its condition holds,
``not_executed`` when that one does, ``unknown`` when neither (or both) does, or the GET
fails or answers 404.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from ctrlrun.errors import InvalidArgument
from ctrlrun.reconcile import ReconcileOutcome, evidenced
from ctrlrun.templates import Template, TemplateSyntaxError, parse_template

from .base import EffectFacts
from .http import (
    DEFAULT_DEADLINE,
    DEFAULT_TIMEOUT,
    SETTLE_MARGIN,
    Miss,
    Reader,
    Remote,
    Verdict,
    bearer,
    dig,
)

log = logging.getLogger(__name__)

_ARGUMENT = re.compile(r"\{([^\W\d]\w*)\}")


@dataclass(frozen=True)
class Check:
    """One route's question: the path to GET, and the conditions that settle the answer."""

    get: str  # path template, e.g. "/v1/invoices/{invoice_id}"
    committed: Mapping[str, Any]  # {"status": "sent"}; a value "{name}" means that argument
    not_executed: Mapping[str, Any]


@dataclass(frozen=True)
class DeclarativeTarget:
    """Where a declarative reconciler asks, and the check of each action it answers for."""

    base_url: str
    checks: tuple[tuple[str, Check], ...]  # (action name, its check); the first that fits
    ca_file: str | None = None
    timeout: float = 30.0  # the deadline the writes are forwarded under (the settle window)


class DeclarativeReconciler(Remote):
    """Answers for the routes of one ``profile: http`` upstream that declare ``reconcile:``."""

    def __init__(
        self,
        base_url: str,
        routes: Sequence[tuple[str, Check]],
        *,
        ca_file: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        deadline: float = DEFAULT_DEADLINE,
        transport: httpx.BaseTransport | None = None,
        write_timeout: float = 0.0,
        settle_margin: float = 0.0,
    ) -> None:
        """``routes``: (action name, its reconcile spec); the first that fits is asked.
        ``not_executed`` waits out the settle window (``http.settled_at``)."""
        super().__init__(
            base_url,
            ca_file=ca_file,
            timeout=timeout,
            deadline=deadline,
            transport=transport,
            write_timeout=write_timeout,
            settle_margin=settle_margin,
        )
        self._routes: list[tuple[str, Template, Check]] = []
        for action, spec in routes:
            try:
                self._routes.append((action, parse_template(spec.get), spec))
            except TemplateSyntaxError as exc:
                raise InvalidArgument(f"reconcile get of {action}: {exc}") from None

    @classmethod
    def for_target(cls, target: DeclarativeTarget) -> DeclarativeReconciler:
        return cls(
            target.base_url,
            target.checks,
            ca_file=target.ca_file,
            write_timeout=target.timeout,
            settle_margin=SETTLE_MARGIN,
        )

    def __call__(self, facts: EffectFacts) -> ReconcileOutcome:
        verdict = self.settle(self._verdict(facts), facts)
        log.info("reconcile %s %s: %s (%s)", facts.action, facts.effect_key, *verdict)
        return evidenced(*verdict)

    def _verdict(self, facts: EffectFacts) -> Verdict:
        args = facts.arguments
        fitting = [
            (template, spec)
            for action, template, spec in self._routes
            if action == facts.action and all(_fills(args.get(n)) for n in template.names)
        ]
        if not fitting:
            return "unknown", "no reconcile route for this action and these arguments"
        template, spec = fitting[0]
        path = template.resolve({n: _segment(args[n]) for n in template.names})
        if any(part in (".", "..") for part in path.partition("?")[0].split("/")):
            # A value "." or ".." is a dot segment, which the client and the server remove:
            # "/v1/invoices/.." asks "/v1", another object whose fields prove nothing.
            return "unknown", f"GET {template.text}: a value makes a dot segment of the path"
        with Reader(
            self.base_url,
            headers=bearer(facts.credentials, None),
            ca_file=self.ca_file,
            timeout=self.timeout,
            deadline=self.deadline,
            transport=self._transport,
        ) as reader:
            reply = reader.get(path)
        if isinstance(reply, Miss):
            return "unknown", f"GET {template.text} answered no object ({reply.value})"
        committed = holds(spec.committed, reply, args)
        not_executed = holds(spec.not_executed, reply, args)
        if committed and not not_executed:
            return "committed", "the committed condition holds"
        if not_executed and not committed:
            return "not_executed", "the not_executed condition holds"
        return "unknown", "both conditions hold" if committed else "neither condition holds"


def holds(condition: Mapping[str, Any], document: Any, arguments: Mapping[str, Any]) -> bool:
    """Every ``dotted.path: value`` pair holds in ``document`` (an empty condition never)."""
    if not condition:
        return False
    for dotted, expected in condition.items():
        if isinstance(expected, str) and (ref := _ARGUMENT.fullmatch(expected)):
            if ref.group(1) not in arguments:
                return False
            expected = arguments[ref.group(1)]
        found, actual = dig(document, str(dotted))
        if not found or not same(actual, expected):
            return False
    return True


def same(actual: Any, expected: Any) -> bool:
    """JSON equality where an integer and its decimal string agree, but a bool is no number.

    Arguments taken from a URL or a form are strings; the remote may answer numbers.
    """
    if isinstance(actual, bool) or isinstance(expected, bool):
        return type(actual) is type(expected) and actual == expected
    if isinstance(actual, int) and isinstance(expected, str):
        return str(actual) == expected
    if isinstance(actual, str) and isinstance(expected, int):
        return actual == str(expected)
    if isinstance(actual, float) or isinstance(expected, float):
        return False  # money and counts are integers here; a float proves nothing
    return bool(actual == expected)


def _fills(value: Any) -> bool:
    return (isinstance(value, str) and value != "") or (
        isinstance(value, int) and not isinstance(value, bool)
    )


def _segment(value: Any) -> str:
    return quote(str(value), safe="")
