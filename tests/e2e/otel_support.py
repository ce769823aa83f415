"""What the e2e trace tests share: the in-memory span exporter, and JSON decision lines."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from ctrlrun.logsetup import JsonFormatter


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


class _JsonLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(JsonFormatter())
        self.docs: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.docs.append(json.loads(self.format(record)))  # formatted where it is logged


@contextmanager
def json_lines() -> Iterator[list[dict[str, Any]]]:
    """The ``ctrlrun`` log lines written meanwhile, as ``--log-format json`` writes them."""
    handler = _JsonLines()
    root = logging.getLogger("ctrlrun")
    root.addHandler(handler)
    try:
        yield handler.docs
    finally:
        root.removeHandler(handler)
