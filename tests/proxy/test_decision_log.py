"""Which ``traceparent`` the sidecar honours: exactly one, well-formed."""

from __future__ import annotations

import pytest

from ctrlrun.proxy import decision_log

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
OTHER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([("traceparent", GOOD)], GOOD),
        ([("TraceParent", GOOD)], GOOD),  # header names are case-insensitive
        ([], None),
        ([("traceparent", GOOD), ("traceparent", OTHER)], None),  # two parents: none
        ([("traceparent", GOOD), ("Traceparent", GOOD)], None),
    ],
)
def test_one_traceparent_or_none(headers: list[tuple[str, str]], expected: str | None) -> None:
    assert decision_log.traceparent(headers) == expected
