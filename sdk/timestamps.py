"""Timestamps as the ledger writes them, formatted once per instant.

A decision writes the same instant into many columns and documents (the record's
``updated_at``, each event's ``ts``, the receipt's ``finished_at``): ``action.iso`` took
~3 µs each time (``astimezone`` and ``strftime``), eleven times a call. ``stamp`` gives the
same text, from ``isoformat`` for an instant already in UTC, and remembers the last few
instants it formatted (a call alternates between its start, its lease's end and its finish),
so the others cost a comparison.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from .action import iso

_ZERO = timedelta(0)
_SLOTS = 4
# The latest first; replaced whole, so a racing thread at worst formats one more time.
_recent: tuple[tuple[datetime, str], ...] = ()


def stamp(ts: datetime) -> str:
    """``action.iso(ts)``: UTC ISO-8601 with milliseconds and ``Z``."""
    global _recent
    recent = _recent
    for known, text in recent:
        if known is ts:
            return text
    for known, text in recent:
        if known == ts:  # the same instant, another object (or zone)
            return text
    if ts.year >= 1000 and (ts.tzinfo is UTC or ts.utcoffset() == _ZERO):
        text = ts.isoformat(timespec="milliseconds")[:23] + "Z"
    else:
        text = iso(ts)
    _recent = ((ts, text), *recent[: _SLOTS - 1])
    return text
