"""Timestamps as the ledger writes them, formatted once per instant.

A decision writes the same instant into many columns and documents (the record's
``updated_at``, each event's ``ts``, the receipt's ``finished_at``): ``action.iso`` took
~3 µs each time (``astimezone`` and ``strftime``), eleven times a call. ``stamp`` gives the
same text, from ``isoformat`` for an instant already in UTC, and remembers the last instant
it formatted, so the others cost a comparison.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from .action import iso

_ZERO = timedelta(0)
_last: tuple[datetime, str] | None = None  # replaced whole: a racing thread only recomputes


def stamp(ts: datetime) -> str:
    """``action.iso(ts)``: UTC ISO-8601 with milliseconds and ``Z``."""
    global _last
    last = _last
    if last is not None and (last[0] is ts or last[0] == ts):
        return last[1]
    if ts.utcoffset() == _ZERO and ts.year >= 1000:
        text = ts.isoformat(timespec="milliseconds")[:23] + "Z"
    else:
        text = iso(ts)
    _last = (ts, text)
    return text
