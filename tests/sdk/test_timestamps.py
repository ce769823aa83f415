"""``stamp`` writes exactly what ``action.iso`` writes, whatever zone and instant it is given."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone

import pytest

from ctrlrun import ledger
from ctrlrun.action import iso
from ctrlrun.events import EventType
from ctrlrun.timestamps import stamp

ZONES = [
    UTC,
    timezone(timedelta(0)),
    timezone(timedelta(hours=2)),
    timezone(timedelta(hours=-5, minutes=-30)),
]


@pytest.mark.parametrize("zone", ZONES, ids=str)
def test_stamp_is_iso(zone: timezone) -> None:
    rng = random.Random(15)
    base = datetime(2026, 1, 1, tzinfo=UTC)
    for _ in range(2000):
        ts = (base + timedelta(microseconds=rng.randrange(10**15))).astimezone(zone)
        assert stamp(ts) == iso(ts)
        assert stamp(ts) == iso(ts)  # the remembered one too


@pytest.mark.parametrize(
    ("ts", "text"),
    [
        (datetime(2026, 12, 1, 18, 0, 0, 999_999, tzinfo=UTC), "2026-12-01T18:00:00.999Z"),
        (datetime(2026, 12, 1, 18, 0, 0, tzinfo=UTC), "2026-12-01T18:00:00.000Z"),
        (
            datetime(2026, 12, 1, 23, 30, tzinfo=timezone(timedelta(hours=-1))),
            "2026-12-02T00:30:00.000Z",
        ),
    ],
)
def test_stamp_examples(ts: datetime, text: str) -> None:
    assert stamp(ts) == text


def test_equal_instants_in_other_zones_give_the_same_text() -> None:
    ts = datetime(2026, 12, 1, 18, 0, 0, 123_000, tzinfo=UTC)
    assert stamp(ts) == stamp(ts.astimezone(timezone(timedelta(hours=3)))) == iso(ts)
    assert stamp(ts + timedelta(milliseconds=1)) == "2026-12-01T18:00:00.124Z"


@pytest.mark.parametrize(
    ("data", "stored"),
    [
        (None, "{}"),
        ({}, "{}"),
        ({"b": 1, "a": "é"}, '{"a":"\\u00e9","b":1}'),
        (
            {"reason": "duplicate", "state": "committed"},
            '{"reason":"duplicate","state":"committed"}',
        ),
    ],
)
def test_event_data_is_stored_as_before(data: dict[str, object] | None, stored: str) -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    row = ledger.event_row(now, EventType.EXECUTION_STARTED, "act_x", "k", None, data)
    assert row["data_json"] == stored
    assert row["ts"] == "2026-12-01T00:00:00.000Z"
