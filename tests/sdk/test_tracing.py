"""Decision fields on log lines, and one OpenTelemetry span per ``@protect`` call."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from sdk_support import receipts

from ctrlrun import Control, DuplicateEffect, SQLiteStateStore, context, protect, tracing
from ctrlrun.logsetup import JsonFormatter

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (f"00-{TRACE_ID}-00f067aa0ba902b7-01", (TRACE_ID, "00f067aa0ba902b7")),
        (f" 00-{TRACE_ID}-00f067aa0ba902b7-00 ", (TRACE_ID, "00f067aa0ba902b7")),
        (None, None),
        ("", None),
        (f"00-{TRACE_ID.upper()}-00f067aa0ba902b7-01", None),  # W3C: lower-case only
        (f"00-{'0' * 32}-00f067aa0ba902b7-01", None),  # all-zero trace id
        (f"00-{TRACE_ID}-{'0' * 16}-01", None),  # all-zero parent id
        (f"ff-{TRACE_ID}-00f067aa0ba902b7-01", None),
        (f"00-{TRACE_ID}-00f067aa0ba902b7-01\nINFO forged line", None),
        (f"00-{TRACE_ID}-00f067aa0ba902b7", None),
    ],
)
def test_traceparent_is_parsed_strictly(
    header: str | None, expected: tuple[str, str] | None
) -> None:
    assert tracing.parse_traceparent(header) == expected


def test_json_line_carries_the_decision_fields(caplog: pytest.LogCaptureFixture) -> None:
    with tracing.protected("x", traceparent=f"00-{TRACE_ID}-00f067aa0ba902b7-01"):
        extra = tracing.decision(action="refund", effect_key="refund:p1", outcome="committed")
        record = logging.LogRecord("ctrlrun", logging.INFO, __file__, 1, "done %s", ("x",), None)
        for key, value in extra.items():
            setattr(record, key, value)
        doc = json.loads(JsonFormatter().format(record))
    assert doc["message"] == "done x"
    assert doc["action"] == "refund" and doc["outcome"] == "committed"
    assert doc["effect_key"] == "refund:p1" and doc["trace_id"] == TRACE_ID
    assert "reason" not in doc  # absent fields are left out, not null
    assert tracing.trace_id() is None  # the trace ends with the call


def test_protect_logs_fields(
    control: Control, store: SQLiteStateStore, caplog: pytest.LogCaptureFixture
) -> None:
    @protect("refund", control=control)
    def refund(payment_id: str, amount: int) -> None:
        return None

    with caplog.at_level(logging.INFO, logger="ctrlrun"), context("bot"):
        refund("p1", 100)
        with pytest.raises(DuplicateEffect):
            refund("p1", 100)
    fields = [r.ctrlrun for r in caplog.records if hasattr(r, "ctrlrun")]
    assert [f["outcome"] for f in fields] == ["committed", "duplicate"]
    first = receipts(store)[0]
    assert fields[0]["receipt_id"] == first["receipt_id"]
    assert fields[0]["policy_hash"] == control.policy.policy_hash
    assert all(f["agent"] == "bot" and f["effect_key"] == "refund:p1" for f in fields)
    # The receipt and the log line name the same trace (none at all without a tracer or parent).
    assert first.get("trace_id") == fields[0].get("trace_id")


# -- spans (the ``otel`` extra) --------------------------------------------------------------


def memory_exporter() -> Any:
    """The in-memory exporter on this process's tracer provider (set up once: OTel allows one)."""
    sdk_trace = pytest.importorskip("opentelemetry.sdk.trace", reason="otel extra not installed")
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = trace.get_tracer_provider()
    if not isinstance(provider, sdk_trace.TracerProvider):
        provider = sdk_trace.TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = getattr(provider, "ctrlrun_test_exporter", None)
    if exporter is None:
        exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        provider.ctrlrun_test_exporter = exporter  # type: ignore[attr-defined]
    exporter.clear()
    return exporter


def test_protect_call_is_a_span_child_of_the_callers(
    control: Control, store: SQLiteStateStore
) -> None:
    exporter = memory_exporter()
    from opentelemetry import trace

    @protect("refund", control=control)
    def refund(payment_id: str, amount: int) -> None:
        return None

    with trace.get_tracer("agent").start_as_current_span("agent step") as outer, context("bot"):
        refund("p9", 100)
        with pytest.raises(DuplicateEffect):
            refund("p9", 100)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"refund", "agent step"}
    ours = [s for s in exporter.get_finished_spans() if s.name == "refund"]
    assert len(ours) == 2
    trace_id = format(outer.get_span_context().trace_id, "032x")
    for span in ours:
        assert span.parent is not None and span.parent.span_id == outer.get_span_context().span_id
        assert span.attributes["ctrlrun.action"] == "refund"
        assert span.attributes["ctrlrun.effect_key"] == "refund:p9"
        assert span.attributes["ctrlrun.policy_hash"] == control.policy.policy_hash
        assert not any("amount" in k or "payment" in k for k in span.attributes)  # no arguments
    assert [s.attributes["ctrlrun.outcome"] for s in ours] == ["committed", "duplicate"]
    assert ours[1].status.description == "DuplicateEffect" and not ours[1].events  # no message
    assert [r["trace_id"] for r in receipts(store)] == [trace_id, trace_id]


def test_async_protect_call_is_a_span_too(control: Control, store: SQLiteStateStore) -> None:
    exporter = memory_exporter()

    @protect("refund", control=control)
    async def refund(payment_id: str, amount: int) -> None:
        assert tracing.trace_id() is not None  # inside the call: its trace

    async def main() -> None:
        with context("bot"):
            await refund("p10", 100)

    asyncio.run(main())
    (span,) = exporter.get_finished_spans()
    assert span.name == "refund" and span.attributes["ctrlrun.outcome"] == "committed"
    assert receipts(store)[-1]["trace_id"] == format(span.context.trace_id, "032x")


def test_without_a_tracer_provider_no_span_is_made_and_the_trace_id_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trace = pytest.importorskip("opentelemetry.trace")
    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    with tracing.protected("x", traceparent=f"00-{TRACE_ID}-00f067aa0ba902b7-01") as traced:
        assert traced.span is None and tracing.trace_id() == TRACE_ID
    with tracing.protected("x") as traced:
        assert traced.span is None and tracing.trace_id() is None
    # A caller's span context (an instrumented server's, with no provider either) is kept.
    other = "0af7651916cd43dd8448eb211c80319c"
    ctx = trace.SpanContext(int(other, 16), 0x00F067AA0BA902B7, is_remote=True)
    with trace.use_span(trace.NonRecordingSpan(ctx)), tracing.protected("x") as traced:
        assert traced.span is None and tracing.trace_id() == other
    assert tracing.trace_id() is None
