"""Who is at the console: operators' tokens, sessions in this process's memory, CSRF tokens.

A session starts before login (``anonymous``: it only carries the CSRF token the login form
needs) and is replaced by a new one when an operator logs in, so a session id seen before
login is worth nothing after it. Session ids and CSRF tokens are 256 random bits; tokens are
compared with ``hmac.compare_digest``. Nothing here is ever logged.
"""

from __future__ import annotations

import hmac
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ctrlrun.operators import Operator

COOKIE = "ctrlrun_console"
MIN_TOKEN = 16  # characters: a shorter token is warned about at start (easy to guess)
SESSION_TTL = 8 * 3600.0  # seconds an operator's session lasts
ANONYMOUS_TTL = 15 * 60.0  # seconds a login form stays valid
# Beyond these, the oldest of the kind are dropped, so memory stays bounded. Apart, so that
# anyone who can reach the login page and asks for it again and again drops only login forms,
# never an operator's session.
MAX_ANONYMOUS = 10_000
MAX_OPERATOR_SESSIONS = 1_000


@dataclass
class Session:
    """One browser's session: who (None before login), its CSRF token, when it ends."""

    sid: str
    operator: str | None
    csrf: str
    expires: float
    flash: list[str] = field(default_factory=list)
    prefix: str = ""  # an operator's: the secret path its pages and cookie are under (scope)

    def csrf_ok(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(
            presented.encode("utf-8"), self.csrf.encode("utf-8")
        )


def tokens_from_env(
    operators: Mapping[str, Operator], environ: Mapping[str, str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """Each operator's token (read once, at start) and the operators who have none set."""
    env = os.environ if environ is None else environ
    found: dict[str, str] = {}
    missing: list[str] = []
    for name, op in sorted(operators.items()):
        token = env.get(op.token_env, "")
        if token:
            found[name] = token
        else:
            missing.append(f"{name} (${op.token_env})")
    return found, missing


def weak(operators: Mapping[str, Operator], tokens: Mapping[str, str]) -> list[str]:
    """The operators whose token is shorter than ``MIN_TOKEN``: a word or a name is guessed
    at two tries a second, even with the delay after a wrong one. Warned about, not refused:
    a deployment's existing tokens keep working."""
    return [
        f"{name} (${operators[name].token_env})"
        for name, token in sorted(tokens.items())
        if len(token) < MIN_TOKEN
    ]


def token_matches(tokens: Mapping[str, str], name: str, presented: str) -> bool:
    """Whether ``presented`` is operator ``name``'s token (constant time in the token)."""
    expected = tokens.get(name)
    # An unknown name is compared against a throwaway, so the answer takes the same time.
    against = expected if expected is not None else secrets.token_urlsafe(32)
    same = hmac.compare_digest(presented.encode("utf-8"), against.encode("utf-8"))
    return same and expected is not None


class Sessions:
    """The sessions of this console process (lost when it stops: everyone logs in again)."""

    def __init__(
        self,
        *,
        ttl: float = SESSION_TTL,
        anonymous_ttl: float = ANONYMOUS_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl, self.anonymous_ttl, self.clock = ttl, anonymous_ttl, clock
        self._lock = threading.Lock()
        self._by_id: dict[str, Session] = {}
        self._anonymous: dict[str, None] = {}  # the ids of login-form sessions, oldest first

    def get(self, sid: str | None) -> Session | None:
        """The live session with id ``sid`` (an expired one is forgotten: None)."""
        if not sid:
            return None
        with self._lock:
            found = self._by_id.get(sid)
            if found is None:
                return None
            if found.expires <= self.clock():
                del self._by_id[sid]
                return None
            return found

    def find(self, sids: list[str], *, prefix: str | None) -> Session | None:
        """The first live session among ``sids`` (a browser may send several cookies of one
        name: another server on the host may have set one): an operator's under ``prefix``,
        or, when ``prefix`` is None, a login form's."""
        for sid in sids:
            found = self.get(sid)
            if found is None:
                continue
            if prefix is None and found.operator is None:
                return found
            if (
                prefix is not None
                and found.operator is not None
                and hmac.compare_digest(found.prefix.encode(), prefix.encode())
            ):
                return found
        return None

    def start(self, operator: str | None) -> Session:
        """A new session: anonymous (for the login form) or an operator's."""
        ttl = self.ttl if operator is not None else self.anonymous_ttl
        new = Session(
            secrets.token_urlsafe(32), operator, secrets.token_urlsafe(32), self.clock() + ttl
        )
        if operator is not None:
            new.prefix = secrets.token_urlsafe(32)
        with self._lock:
            self._prune(anonymous=operator is None)
            self._by_id[new.sid] = new
            if operator is None:
                self._anonymous[new.sid] = None
        return new

    def end(self, sid: str) -> None:
        with self._lock:
            self._by_id.pop(sid, None)
            self._anonymous.pop(sid, None)

    def count(self) -> tuple[int, int]:
        """(login forms, operators' sessions) held now."""
        with self._lock:
            return len(self._anonymous), len(self._by_id) - len(self._anonymous)

    def _prune(self, *, anonymous: bool) -> None:
        now = self.clock()
        if anonymous:
            # Login forms end in the order they were made (one TTL, a monotonic clock): only
            # the oldest are looked at, so a flood of login pages costs no sweep of them all.
            while self._anonymous:
                oldest = next(iter(self._anonymous))  # dicts keep insertion order
                held = self._by_id.get(oldest)
                live = held is not None and held.expires > now
                if live and len(self._anonymous) < MAX_ANONYMOUS:
                    break
                del self._anonymous[oldest]
                self._by_id.pop(oldest, None)
            return
        for sid in [s for s, v in self._by_id.items() if v.expires <= now]:
            del self._by_id[sid]
            self._anonymous.pop(sid, None)
        named = [s for s in self._by_id if s not in self._anonymous]
        for sid in named[: max(0, len(named) - MAX_OPERATOR_SESSIONS + 1)]:
            del self._by_id[sid]


class LoginGate:
    """One login at a time per operator name (every unknown name shares one), so that the wait
    after a wrong token bounds guessing however many connections ask at once: a login asked
    while another as the same name is being checked (or waits out its wrong token) is refused
    at once, its token unread, and holds no connection for the wait."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy: set[str] = set()

    def enter(self, key: str) -> bool:
        with self._lock:
            if key in self._busy:
                return False
            self._busy.add(key)
            return True

    def leave(self, key: str) -> None:
        with self._lock:
            self._busy.discard(key)


def cookie_header(sid: str, *, path: str, secure: bool, max_age: int | None = None) -> str:
    """``Set-Cookie`` for the session: HttpOnly, SameSite=Strict, under ``path`` (an operator's
    secret prefix, or the login form's), Secure over TLS."""
    parts = [f"{COOKIE}={sid}", "HttpOnly", "SameSite=Strict", f"Path={path}"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def session_ids(cookie_values: list[str]) -> list[str]:
    """Every value of our cookie in the ``Cookie`` headers, in the order the browser sent them
    (the longest path first), at most 20."""
    found = []
    for header in cookie_values:
        for part in header.split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE and value:
                found.append(value)
    return found[:20]


def session_id(cookie_value: str | None) -> str | None:
    """Our (first) session id in a ``Cookie`` or ``Set-Cookie`` header, if any."""
    found = session_ids([cookie_value] if cookie_value else [])
    return found[0] if found else None
