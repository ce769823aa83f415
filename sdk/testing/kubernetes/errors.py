"""Apiserver refusals: the error a request gets, with the details a ``Status`` carries."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

DEPLOYMENTS = ("apps", "deployments")
NAMESPACES = ("", "namespaces")


class ApiError(Exception):
    """An apiserver refusal: HTTP ``code`` and a message for the ``Status`` body."""

    def __init__(
        self,
        code: int,
        message: str,
        details: Mapping[str, Any] | None = None,
        *,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.details = dict(details or {})
        self.reason = reason


def not_found(kind: tuple[str, str], name: str) -> ApiError:
    group, plural = kind
    resource = f"{plural}.{group}" if group else plural
    return ApiError(404, f'{resource} "{name}" not found', details(kind, name))


def conflict(kind: tuple[str, str], name: str, why: str) -> ApiError:
    group, plural = kind
    resource = f"{plural}.{group}" if group else plural
    return ApiError(
        409, f'Operation cannot be fulfilled on {resource} "{name}": {why}', details(kind, name)
    )


def details(kind: tuple[str, str], name: str) -> dict[str, str]:
    group, plural = kind
    return (
        {"name": name, "group": group, "kind": plural} if group else {"name": name, "kind": plural}
    )


def parse_json(body: bytes) -> Any:
    try:
        return json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body of the request could not be decoded: {exc}") from exc
