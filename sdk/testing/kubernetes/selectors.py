"""Label and field selectors (the equality subset kubectl and the clients send)."""

from __future__ import annotations

from collections.abc import Mapping

from .errors import ApiError


def selector_matches(selector: str, fields: Mapping[str, str]) -> bool:
    """Equality selectors (``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``), comma-separated, ANDed."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = (p.strip() for p in term.split("!=", 1))
            if fields.get(key) == value:
                return False
        elif "=" in term:
            key, value = (p.strip() for p in term.replace("==", "=").split("=", 1))
            if fields.get(key) != value:
                return False
        elif " in " in term or " notin " in term or "(" in term:
            raise ApiError(400, f"set-based selectors are not supported by the fake: {term!r}")
        elif term.startswith("!"):
            if term[1:] in fields:
                return False
        elif term not in fields:
            return False
    return True
