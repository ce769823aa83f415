"""Decision fields for logs, and OpenTelemetry spans when the ``otel`` extra is installed.

One protected request (proxy) or call (``@protect``) runs inside ``protected(...)``: the
agent's W3C ``traceparent`` (or the caller's current span) is its parent, and its trace id is
what the decision's log lines and receipt carry. The kernel reports each decision once with
``decision(...)``: the fields go on the log record (``JsonFormatter`` writes them) and on the
span as ``ctrlrun.*`` attributes. Never arguments, never a body, never a header's value.

OpenTelemetry is imported on the first protected call, never by ``import ctrlrun``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

# W3C Trace Context: version 00, lower-case hex; an all-zero id is invalid. The header is the
# agent's to write: anything else is ignored, so it can never put other text in a log line.
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
SPAN_ATTRIBUTES = ("action", "effect_key", "outcome", "reason", "receipt_id", "policy_hash")


@dataclass
class Traced:
    """The protected request or call in progress: its trace id, and its span if any."""

    trace_id: str | None
    span: Any = None  # an OpenTelemetry span, when the extra is installed
    agent: str | None = None  # who asked: a decision line the kernel did not write names it too


_current: ContextVar[Traced | None] = ContextVar("ctrlrun_traced", default=None)
_otel_missing = False
_trace: Any = None  # opentelemetry.trace, once imported


def parse_traceparent(value: str | None) -> tuple[str, str] | None:
    """``(trace_id, parent_id)`` of a valid ``traceparent`` header, else ``None``."""
    if not value:
        return None
    found = _TRACEPARENT.fullmatch(value.strip())
    if found is None or set(found[1]) == {"0"} or set(found[2]) == {"0"}:
        return None
    return found[1], found[2]


def trace_id() -> str | None:
    """The trace id of the protected request or call in progress, if it has one."""
    traced = _current.get()
    return traced.trace_id if traced else None


def _trace_api() -> Any:
    """The ``opentelemetry.trace`` module, or None when the extra is not installed."""
    global _otel_missing, _trace
    if _trace is not None or _otel_missing:
        return _trace
    try:
        from opentelemetry import trace
    except ImportError:
        _otel_missing = True
        return None
    _trace = trace
    return trace


class _Scope:
    """``protected`` when no span is recorded: the call's ``Traced`` is current in the block."""

    __slots__ = ("token", "traced")

    def __init__(self, traced: Traced) -> None:
        self.traced = traced

    def __enter__(self) -> Traced:
        self.token = _current.set(self.traced)
        return self.traced

    def __exit__(self, *exc: object) -> None:
        _current.reset(self.token)


def protected(
    name: str, *, traceparent: str | None = None, agent: str | None = None
) -> AbstractContextManager[Traced]:
    """Run one protected request or call as a span named ``name`` (renamed for its action).

    With no tracer provider configured (OpenTelemetry's own no-op, checked on each call: one
    may be set at any time), no span is made: the call carries the trace id it would have had
    (the agent's ``traceparent``, else the current span's), at a fraction of the cost.
    """
    parent = parse_traceparent(traceparent)
    trace = _trace_api()
    if trace is None:
        return _Scope(Traced(parent[0] if parent else None, agent=agent))
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        if parent is not None:
            return _Scope(Traced(parent[0], agent=agent))
        sc = trace.get_current_span().get_span_context()
        return _Scope(Traced(format(sc.trace_id, "032x") if sc.is_valid else None, agent=agent))
    return _spanned(trace, name, traceparent, parent, agent)


@contextmanager
def _spanned(
    trace: Any,
    name: str,
    traceparent: str | None,
    parent: tuple[str, str] | None,
    agent: str | None,
) -> Iterator[Traced]:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    ctx = TraceContextTextMapPropagator().extract({"traceparent": traceparent}) if parent else None
    tracer = trace.get_tracer("ctrlrun")
    # An exception's text may carry anything (a remote's error, an argument): the span says
    # only its type, never its message or traceback.
    with tracer.start_as_current_span(
        name, context=ctx, record_exception=False, set_status_on_exception=False
    ) as span:
        sc = span.get_span_context()
        tid = format(sc.trace_id, "032x") if sc.is_valid else (parent[0] if parent else None)
        traced = Traced(tid, span, agent)
        token = _current.set(traced)
        try:
            yield traced
        except BaseException as exc:
            span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            _current.reset(token)


def decision(**fields: Any) -> dict[str, Any]:
    """``extra=`` for a decision's log line; the same fields noted on the current span."""
    present = {k: v for k, v in fields.items() if v is not None}
    traced = _current.get()
    if traced is not None:
        if traced.trace_id:
            present["trace_id"] = traced.trace_id
        if traced.agent and "agent" not in present:
            present["agent"] = traced.agent
        note(**present)
    return {"ctrlrun": present}


def note(**fields: Any) -> None:
    """Set the decision's ``ctrlrun.*`` attributes on the current span (its name: the action)."""
    traced = _current.get()
    if traced is None or traced.span is None:
        return
    span = traced.span
    if fields.get("action"):
        span.update_name(str(fields["action"]))
    for key in SPAN_ATTRIBUTES:
        if fields.get(key) is not None:
            span.set_attribute(f"ctrlrun.{key}", str(fields[key]))
