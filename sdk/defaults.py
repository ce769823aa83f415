"""The process-wide Control that ``protect`` uses when it is given none, built on first use."""

from __future__ import annotations

import threading

from .control import Control

_default: Control | None = None
_default_lock = threading.Lock()


def process_control() -> Control:
    """The Control on the configured policy and ledger (``Control.from_file()``), made once."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Control.from_file()
        return _default
