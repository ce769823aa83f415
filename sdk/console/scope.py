"""Where an operator's session cookie goes: under a secret path of its own, never to the host.

Browsers send a cookie to every port of its host (RFC 6265 has no port in a cookie's scope, and
SameSite counts every port of 127.0.0.1 as the same site), so a cookie at ``Path=/`` of a
console on 127.0.0.1:9091 also reaches whatever else a browser opens on 127.0.0.1: a dev server,
a notebook, a page an agent serves on a port of its own. That server could replay it and act as
the operator. So each login gets a secret prefix (256 random bits, apart from the session id):
its pages are served under ``/s/<prefix>/`` and its cookie carries ``Path=/s/<prefix>``, which
no other server is ever asked for (the prefix is in no cookie of a wider path, in no log line,
and in no ``Referer``: ``Referrer-Policy: no-referrer``). The login form's cookie, worth nothing
but its CSRF token, carries ``Path=/login``. The documented addresses go on working: ``/``,
``/approvals``, ``/ambiguous``, ``/receipts`` and ``/freeze`` lead to the login page, which
then lands on that page under the new prefix.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs

ROOT = "/s/"  # what starts every path of an operator's session
LOGIN = "/login"  # the login form's path, and its cookie's
PAGES = ("/approvals", "/ambiguous", "/receipts", "/freeze")
_PREFIXED = re.compile(r"^/s/([^/]*)(/.*)?$")


def split(path: str) -> tuple[str | None, str]:
    """``/s/PREFIX/rest`` -> (PREFIX, ``/rest``); any other path -> (None, path)."""
    found = _PREFIXED.match(path)
    if found is None:
        return None, path
    return found.group(1), found.group(2) or "/"


def base(prefix: str) -> str:
    """What the paths of the session with ``prefix`` start with (and its cookie's Path)."""
    return ROOT + prefix


def shown(path: str) -> str:
    """``path`` for a log line: a session's prefix is never written out."""
    prefix, rest = split(path)
    return path if prefix is None else f"{ROOT}...{rest}"


def login_query(query: str) -> tuple[str, bool]:
    """What the login page's query asks: the page it leads to, and whether to say the session
    ended (``expired``)."""
    try:
        fields = parse_qs(query, keep_blank_values=True, max_num_fields=5)
    except ValueError:
        fields = {}
    return landing(fields.get("next", [""])[0]), "expired" in fields


def landing(asked: str) -> str:
    """The page a login leads to: ``asked`` when it names one of the pages, else approvals.
    Only those: a login never sends the browser to an address a link chose."""
    return asked if asked in PAGES else PAGES[0]


REDACTED = re.compile(r"/s/[^/\s'\"?#]+")


def redact(text: str) -> str:
    """A log line's text with every session prefix in it replaced (a request line quoted in
    a complaint about it)."""
    return REDACTED.sub("/s/...", text)


def to_login(page: str | None, *, expired: bool) -> str:
    """The login page's address, saying the session ended and where to go after it."""
    query = ["expired"] if expired else []
    if page in PAGES and page != PAGES[0]:
        query.append(f"next={page}")
    return LOGIN + ("?" + "&".join(query) if query else "")
