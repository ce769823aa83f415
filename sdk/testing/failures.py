"""Failure injection for the fake remotes: what the next writes (or reads) suffer.

Write modes (``fail_next``): ``commit_then_drop``, ``commit_then_500``, ``hang``,
``reset_before`` or an HTTP status. Read modes (``fail_reads``): a 5xx status, ``hang`` or
``drop``. Reads never consume a write failure and writes never consume a read failure.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Generic, Literal, TypeAlias, TypeVar

WriteMode: TypeAlias = Literal["commit_then_drop", "commit_then_500", "hang", "reset_before"] | int
ReadMode: TypeAlias = Literal["hang", "drop"] | int

WRITE_MODES = frozenset({"commit_then_drop", "commit_then_500", "hang", "reset_before"})
READ_MODES = frozenset({"hang", "drop"})
INJECTABLE_STATUSES = frozenset({400, 402, 404, 408, 409, 424, 429, 500, 502, 503, 504})
MAX_HANG_SECONDS = 300.0


_M = TypeVar("_M", WriteMode, ReadMode)


@dataclass
class _Armed(Generic[_M]):
    mode: _M
    path: str | None
    remaining: int | None  # None: until cleared


class Failures:
    """Thread-safe queues of armed failures; the server consumes them as requests arrive."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writes: list[_Armed[WriteMode]] = []
        self._reads: _Armed[ReadMode] | None = None
        self._delays: list[float] = []

    def fail_next(self, mode: WriteMode | None, times: int = 1, *, path: str | None) -> None:
        if mode is None:
            with self._lock:
                self._writes.clear()
                self._delays.clear()
            return
        if isinstance(mode, bool) or not (
            mode in WRITE_MODES or (isinstance(mode, int) and mode in INJECTABLE_STATUSES)
        ):
            raise ValueError(f"unknown write failure mode: {mode!r}")
        if times < 1:
            raise ValueError("times must be at least 1")
        with self._lock:
            self._writes.append(_Armed(mode, path, times))

    def fail_reads(self, mode: ReadMode | None, times: int | None, *, path: str | None) -> None:
        if mode is not None and (
            isinstance(mode, bool)
            or not (mode in READ_MODES or (isinstance(mode, int) and 500 <= mode <= 599))
        ):
            raise ValueError(f"unknown read failure mode: {mode!r}")
        if times is not None and times < 1:
            raise ValueError("times must be at least 1 (or None: until cleared)")
        with self._lock:
            self._reads = None if mode is None else _Armed(mode, path, times)

    def delay_next(self, seconds: float) -> None:
        if not 0 <= seconds <= MAX_HANG_SECONDS:
            raise ValueError(f"delay must be within 0..{MAX_HANG_SECONDS:g} seconds")
        with self._lock:
            self._delays.append(seconds)

    def take_write(self, path: str) -> WriteMode | None:
        with self._lock:
            for armed in self._writes:
                if armed.path is None or path.startswith(armed.path):
                    _consume(armed)
                    if armed.remaining == 0:
                        self._writes.remove(armed)
                    return armed.mode
        return None

    def take_delay(self) -> float:
        with self._lock:
            return self._delays.pop(0) if self._delays else 0.0

    def take_read(self, path: str) -> ReadMode | None:
        with self._lock:
            armed = self._reads
            if armed is None or (armed.path is not None and not path.startswith(armed.path)):
                return None
            _consume(armed)
            if armed.remaining == 0:
                self._reads = None
            return armed.mode


def _consume(armed: _Armed[WriteMode] | _Armed[ReadMode]) -> None:
    if armed.remaining is not None:
        armed.remaining -= 1
