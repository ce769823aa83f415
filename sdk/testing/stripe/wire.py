"""Stripe v1 wire conventions for the fake: bracket-keyed forms, errors, ids and list pages."""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import Any

Params = dict[str, Any]
StripeObject = dict[str, Any]

_INT = re.compile(r"-?[0-9]{1,18}")


class StripeError(Exception):
    """An answer in Stripe's error shape; ``stored`` when idempotency keeps it for replays."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        stored: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body: dict[str, Any] = {
            "error": {"type": error_type, "code": code, "message": message}
        }
        if param is not None:
            self.body["error"]["param"] = param
        self.stored = stored


# (status, type, code, message) for injected statuses, in Stripe's own words where it has them.
_INJECTED: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", "parameter_invalid_empty", "Invalid request (injected)."),
    402: ("card_error", "card_declined", "Your card was declined."),
    404: ("invalid_request_error", "resource_missing", "No such object (injected)."),
    408: ("api_error", None, "Request timed out (injected)."),
    409: (
        "invalid_request_error",
        "idempotency_key_in_use",
        "There is currently another "
        "in-progress request using this Idempotent Key (that probably means you submitted "
        "twice, and the other request is still going through).",
    ),
    424: ("api_error", None, "An external dependency failed (injected)."),
    429: ("invalid_request_error", "rate_limit", "Request rate limit exceeded (injected)."),
}


def injected_error(status: int) -> StripeError:
    """The error Stripe answers with ``status`` (for failure injection)."""
    error_type, code, message = _INJECTED.get(status, ("api_error", None, ""))
    message = message or "An unknown error occurred (injected)."
    return StripeError(status, message, error_type=error_type, code=code)


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def parse_form(pairs: Iterable[tuple[str, str]]) -> Params:
    """Bracket keys: ``metadata[k]=v`` -> ``{"metadata": {"k": "v"}}``, ``e[]=a`` -> a list."""
    out: Params = {}
    for key, value in pairs:
        name, _, rest = key.partition("[")
        parts = [name, *rest[:-1].split("][")] if rest.endswith("]") else [key]
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if parts[i + 1] == "":
                if not isinstance(child, list):
                    child = node[part] = []
                child.append(value)
                break
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        else:
            node[parts[-1]] = value
    return out


def int_param(
    params: Mapping[str, Any], name: str, *, default: int | None = None, minimum: int = 0
) -> int | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    if not isinstance(raw, str) or not _INT.fullmatch(raw):
        raise StripeError(
            400, f"Invalid integer: {raw}", code="parameter_invalid_integer", param=name
        )
    value = int(raw)
    if value < minimum:
        raise StripeError(
            400,
            f"This value must be greater than or equal to {minimum}.",
            code="parameter_invalid_integer",
            param=name,
        )
    return value


def required_int(params: Mapping[str, Any], name: str, *, minimum: int = 0) -> int:
    value = int_param(params, name, minimum=minimum)
    if value is None:
        raise StripeError(
            400, f"Missing required param: {name}.", code="parameter_missing", param=name
        )
    return value


def required(params: Mapping[str, Any], name: str) -> Any:
    value = params.get(name)
    if value is None or value == "":
        raise StripeError(
            400, f"Missing required param: {name}.", code="parameter_missing", param=name
        )
    return value


def metadata_param(params: Mapping[str, Any]) -> dict[str, str]:
    raw = params.get("metadata")
    if raw is None or raw == "":
        return {}
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise StripeError(400, "Invalid hash", code="parameter_invalid_string", param="metadata")
    return dict(raw)


def created_matches(params: Mapping[str, Any], created: int) -> bool:
    """Stripe's ``created`` filter: an exact integer or ``created[gt|gte|lt|lte]``."""
    raw = params.get("created")
    if raw is None:
        return True
    if isinstance(raw, str):
        exact = int_param(params, "created")
        return exact is None or created == exact
    if not isinstance(raw, dict) or not set(raw) <= {"gt", "gte", "lt", "lte"}:
        raise StripeError(400, "Invalid created filter", code="parameter_unknown", param="created")
    bounds = {op: int_param(raw, op) for op in raw}
    checks: dict[str, Callable[[int, int], bool]] = {
        "gt": lambda c, b: c > b,
        "gte": lambda c, b: c >= b,
        "lt": lambda c, b: c < b,
        "lte": lambda c, b: c <= b,
    }
    return all(b is None or checks[op](created, b) for op, b in bounds.items())


def newest_first(objects: Iterable[StripeObject]) -> list[StripeObject]:
    """Stripe's list order: newest ``created`` first, later insertions first among equals."""
    return sorted(reversed(list(objects)), key=lambda o: int(o["created"]), reverse=True)


def list_page(
    ordered: list[StripeObject],
    params: Mapping[str, Any],
    url: str,
    keep: Callable[[StripeObject], bool],
    kind: str,
) -> dict[str, Any]:
    """One page of ``ordered`` (already newest first) honouring limit and the cursors."""
    limit = int_param(params, "limit", default=10, minimum=1)
    assert limit is not None
    if limit > 100:
        raise StripeError(
            400,
            "This value must be less than or equal to 100.",
            code="parameter_invalid_integer",
            param="limit",
        )
    candidates = ordered
    for cursor in ("starting_after", "ending_before"):
        cursor_id = params.get(cursor)
        if not cursor_id:
            continue
        index = next((i for i, o in enumerate(ordered) if o["id"] == cursor_id), None)
        if index is None:
            raise StripeError(
                400, f"No such {kind}: '{cursor_id}'", code="resource_missing", param=cursor
            )
        candidates = ordered[index + 1 :] if cursor == "starting_after" else ordered[:index]
        break
    matching = [o for o in candidates if keep(o)]
    backwards = bool(params.get("ending_before")) and not params.get("starting_after")
    page = matching[-limit:] if backwards else matching[:limit]
    return {"object": "list", "url": url, "has_more": len(matching) > limit, "data": page}
