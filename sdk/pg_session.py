"""The limits every PostgreSQL session of a ledger runs under, and how a store URL sets them.

Without them one frozen session (a sidecar stopped mid-transaction, a human's ``psql`` left
open on ``BEGIN``) holding the receipt-chain row held every other sidecar for as long as it
lived. With them a waiter gives up after ``lock_timeout`` (the request is refused
``unavailable``: nothing is forwarded), and the server ends a session left idle inside a
transaction, releasing its locks. A store URL may set each one, as a query parameter::

    postgresql://ctrlrun@db/ledger?lock_timeout=2s&statement_timeout=10s

Values are PostgreSQL's: an integer of milliseconds, or one with a unit (``ms``, ``s``,
``min``); ``0`` turns a limit off.
"""

from __future__ import annotations

import re

from sqlalchemy.engine import URL

from .errors import InvalidArgument

TIMEOUTS = {
    "lock_timeout": "5s",
    "statement_timeout": "10s",
    "idle_in_transaction_session_timeout": "15s",
}
# Opening a store may migrate it while other openers wait on the advisory lock: that wait is
# allowed longer than any decision's statement.
OPEN_TIMEOUT = "120s"
_VALUE = re.compile(r"\d+(ms|s|min)?")


def session_options(url: URL) -> tuple[URL, dict[str, str]]:
    """The URL without ctrlrun's timeout parameters, and the timeouts every session sets."""
    query = dict(url.query)
    settings = dict(TIMEOUTS)
    for name in TIMEOUTS:
        if name not in query:
            continue
        value = query.pop(name)
        if not isinstance(value, str) or not _VALUE.fullmatch(value.strip()):
            raise InvalidArgument(
                f"store URL: {name}={value!r} is not a duration (e.g. 5000, 500ms, 5s, 1min)"
            )
        settings[name] = value.strip()
    return url.set(query=query), settings


def options_string(settings: dict[str, str], given: str | None = None) -> str:
    """libpq ``options`` that apply ``settings``; any the URL gave come last, so they win."""
    ours = " ".join(f"-c {name}={value}" for name, value in settings.items())
    return f"{ours} {given}" if given else ours
