"""The REST paths the fake apiserver serves: which resource a path names, and its parts."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

from ..messages import Request
from .errors import ApiError, parse_json

_NAME = "([^/]+)"
PATHS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(rx))
    for kind, rx in [
        ("namespaces", r"/api/v1/namespaces"),
        ("namespace", rf"/api/v1/namespaces/{_NAME}"),
        ("all_deployments", r"/apis/apps/v1/deployments"),
        ("deployments", rf"/apis/apps/v1/namespaces/{_NAME}/deployments"),
        ("deployment", rf"/apis/apps/v1/namespaces/{_NAME}/deployments/{_NAME}"),
        ("scale", rf"/apis/apps/v1/namespaces/{_NAME}/deployments/{_NAME}/scale"),
        ("pod", rf"/api/v1/namespaces/{_NAME}/pods/{_NAME}"),
        ("exec", rf"/api/v1/namespaces/{_NAME}/pods/{_NAME}/exec"),
        ("attach", rf"/api/v1/namespaces/{_NAME}/pods/{_NAME}/attach"),
        ("portforward", rf"/api/v1/namespaces/{_NAME}/pods/{_NAME}/portforward"),
        # The apiserver's proxies to a pod's or a service's application (its own paths after).
        ("pod_proxy", rf"/api/v1/namespaces/{_NAME}/pods/{_NAME}/proxy(?:/.*)?"),
        ("service_proxy", rf"/api/v1/namespaces/{_NAME}/services/{_NAME}/proxy(?:/.*)?"),
        (
            "ephemeralcontainers",
            rf"/api/v1/namespaces/{_NAME}/pods/{_NAME}/ephemeralcontainers",
        ),
    ]
)


@dataclass(frozen=True)
class Call:
    """A request routed to a resource: its kind, and the namespace and name in its path."""

    kind: str
    namespace: str
    name: str
    request: Request
    query: Mapping[str, str]

    @property
    def dry_run(self) -> bool:
        return dry_run_of(self.request)

    @property
    def field_manager(self) -> str | None:
        return self.query.get("fieldManager")

    @property
    def content_type(self) -> str:
        return self.request.header("content-type")

    @property
    def body(self) -> bytes:
        return self.request.body

    @property
    def as_table(self) -> bool:
        """The client asked for a server-side Table (what kubectl get prints)."""
        return "as=Table" in self.request.header("accept")

    def json(self) -> Any:
        return parse_json(self.request.body)

    def options(self) -> dict[str, Any]:
        """The body of a DELETE: ``DeleteOptions`` (preconditions), or nothing."""
        options = self.json()
        return options if isinstance(options, dict) else {}


_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
# net/url's urlmaxqueryparams (Go 1.24.12, 1.25.6 and later): past it, no parameter is read.
GO_MAX_QUERY_PARAMETERS = 10_000


def go_query(target: str) -> dict[str, list[str]]:
    """The query as the apiserver reads it (Go's ``url.ParseRequestURI`` and ``URL.Query``):
    everything after the first '?', a '#' included; a pair holding ';' or a bad escape is
    dropped, and a query of more than 10,000 parameters is not read at all."""
    raw = target.partition("?")[2]
    query: dict[str, list[str]] = {}
    if raw.count("&") + 1 > GO_MAX_QUERY_PARAMETERS:
        return query
    for pair in raw.split("&"):
        if not pair or ";" in pair or _BAD_ESCAPE.search(pair):
            continue
        key, _, value = pair.partition("=")
        query.setdefault(unquote_plus(key), []).append(unquote_plus(value))
    return query


def is_dry_run(query: Mapping[str, list[str]]) -> bool:
    values = query.get("dryRun", [])
    return bool(values) and all(value == "All" for value in values)


def check_dry_run(request: Request) -> None:
    """Refuse a write's ``dryRun`` values other than ``All`` (the apiserver's ValidateDryRun):
    ``dryRun=all`` or a blank ``dryRun=`` beside ``All`` is a 422, never a write."""
    values = go_query(request.target).get("dryRun", [])
    for value in values:
        if value != "All":
            raise ApiError(422, f'dryRun: Unsupported value: "{value}": supported values: "All"')


def dry_run_of(request: Request) -> bool:
    """Whether the apiserver would persist nothing: ``dryRun=All`` in the query, or, for a
    DELETE with a body, ``"dryRun": ["All"]`` in its DeleteOptions (the query is then not
    read: the body's options win)."""
    if request.method == "DELETE" and request.body.strip():
        try:
            options = json.loads(request.body)
        except (ValueError, UnicodeDecodeError):
            return False
        return isinstance(options, dict) and options.get("dryRun") == ["All"]
    return is_dry_run(go_query(request.target))


def route(request: Request) -> Call | None:
    """The call ``request`` makes on a resource; None when the fake serves no such path."""
    path = request.path.rstrip("/") or "/"
    for kind, pattern in PATHS:
        match = pattern.fullmatch(path)
        if match is None:
            continue
        namespace, name = [*match.groups(), "", ""][:2]
        if kind == "namespace":  # /api/v1/namespaces/{name}: the one group is the name
            namespace, name = "", namespace
        return Call(kind, namespace, name, request, dict(request.query))
    return None
