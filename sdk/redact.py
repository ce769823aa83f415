"""Credentials out of exception text, before it is recorded or logged.

An exception's message is kept with the attempt (``Type: message``) because it says what
went wrong; but a client library's message may quote what it sent: a URL with a password or
an ``api_key=`` query, an ``Authorization`` value, a provider's key. Those shapes are
replaced by ``***``; the rest of the message stays.
"""

from __future__ import annotations

import re

MASK = "***"
_SHAPES = (
    # scheme://user:password@host
    (re.compile(r"(?<=://)[^\s/@:]*:[^\s/@]*@"), MASK + "@"),
    # Authorization: Bearer <token>, Basic <base64>, ...
    (re.compile(r"\b(Bearer|Basic|Token|Digest)\s+[\w.~+/=-]+", re.IGNORECASE), r"\1 " + MASK),
    # api_key=..., "token": "...", password: ..., client_secret=...
    (
        re.compile(
            r"""(?i)\b([\w-]*?(?:key|token|secret|passw(?:or)?d|pwd|signature|credentials?|"""
            r"""auth(?:orization)?)["']?\s*[=:]\s*["']?)[^\s&'",;)]+"""
        ),
        r"\1" + MASK,
    ),
    # well-known key formats: Stripe, GitHub, Slack, AWS access keys, JWTs
    (
        re.compile(
            r"\b(?:(?:sk|rk|pk)_(?:live|test)_\w+|whsec_\w+|gh[pousr]_\w{20,}|"
            r"xox[abeprs]-[\w-]+|AKIA[0-9A-Z]{16}|eyJ[\w-]+\.[\w-]+\.[\w-]*)"
        ),
        MASK,
    ),
)


def redact(text: str) -> str:
    """``text`` with every credential-shaped part replaced by ``***``."""
    for shape, replacement in _SHAPES:
        text = shape.sub(replacement, text)
    return text
