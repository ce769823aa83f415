"""Where the policy and the ledger are: the one module that reads the environment.

It imports nothing that builds on it (the policy, the Control), so every module may use it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import InvalidArgument, PolicyError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL


def policy_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """explicit path -> ``$CTRLRUN_CONFIG`` -> ``./ctrlrun.yaml``."""
    if explicit is not None:
        return Path(explicit)
    env = os.environ.get("CTRLRUN_CONFIG")
    if env is not None:
        if not env.strip():
            raise PolicyError("CTRLRUN_CONFIG is set but empty; unset it or name a policy file")
        return Path(env)
    return Path.cwd() / "ctrlrun.yaml"


def store_url(explicit: str | None = None, policy: str | os.PathLike[str] | None = None) -> str:
    """``--store-url`` -> ``$CTRLRUN_STORE_URL`` -> ``$CTRLRUN_STATE`` -> beside the policy."""
    if explicit:
        return explicit
    url = os.environ.get("CTRLRUN_STORE_URL")
    if url is not None and url.strip():
        return url.strip()
    state = os.environ.get("CTRLRUN_STATE")
    if state is not None:
        if not state.strip():
            raise InvalidArgument("CTRLRUN_STATE is set but empty; unset it or name a SQLite file")
        return sqlite_url(Path(state).resolve())
    base = policy_path(policy).resolve().parent
    return sqlite_url(base / ".ctrlrun" / "state.db")


def sqlite_url(path: str | os.PathLike[str]) -> str:
    """The store URL of a SQLite file, ``?`` and ``#`` in its name escaped (``%3F``, ``%23``)."""
    from sqlalchemy.engine import URL

    return URL.create("sqlite", database=str(path)).render_as_string()


def parse_store_url(url: str) -> URL:
    """``url`` parsed; InvalidArgument (one line, naming the forms) if it is not a URL."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is no number
        raise InvalidArgument(
            f"not a store URL: {_unparsed(url)!r} (use sqlite:///PATH or postgresql://…)"
        ) from None
    if parsed.drivername.startswith("sqlite") and "?" in url:
        # The URL's query, not part of the name: "sqlite:///a?b.db" would name the file "a".
        raise InvalidArgument(
            f"a sqlite store URL takes no query: {_unparsed(url)!r} (write ? as %3F in a file name)"
        )
    return parsed


def shown_url(url: URL) -> str:
    """A store URL as a message or a log line shows it: its password masked, before the '@'
    or in the query (libpq reads ``?password=`` and ``?sslpassword=`` as well)."""
    from .redact import redact

    return redact(url.render_as_string(hide_password=True))


def _unparsed(url: str) -> str:
    """A store URL that did not parse, as an error shows it: nothing before its last '@'
    (where a password is), and no ``password=`` anywhere."""
    from .redact import redact

    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.rpartition("@")[2]
    elif "@" in scheme:
        scheme = "***@" + scheme.rpartition("@")[2]
    return redact(scheme + sep + rest)


def sqlite_file(parsed: URL) -> str:
    """The file a ``sqlite:///PATH`` URL names; InvalidArgument when it names none."""
    if not parsed.database:
        raise InvalidArgument("a sqlite store URL needs a file: sqlite:///path/to/state.db")
    return parsed.database


def environment() -> str:
    """``$CTRLRUN_ENVIRONMENT``, recorded with every action (default ``production``)."""
    return os.environ.get("CTRLRUN_ENVIRONMENT") or "production"


def clock_offset() -> float:
    """``$CTRLRUN_CLOCK_OFFSET``: seconds added to this host's clock. For tests only: it stands
    for a host whose clock is wrong (``ctrlrun.clocks``)."""
    return _seconds("CTRLRUN_CLOCK_OFFSET", 0.0, signed=True)


def clock_skew_bound() -> float:
    """``$CTRLRUN_CLOCK_SKEW_BOUND``: seconds this host's clock may be from the ledger's before
    it is reported (default 1)."""
    return _seconds("CTRLRUN_CLOCK_SKEW_BOUND", 1.0, signed=False)


def _seconds(name: str, default: float, *, signed: bool) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidArgument(f"{name} must be a number of seconds, not {raw!r}") from None
    if value != value or abs(value) == float("inf") or (not signed and value < 0):
        raise InvalidArgument(f"{name} must be a finite{'' if signed else ', positive'} number")
    return value
