"""Route matching: which action, with which arguments, an upstream request is.

Pure functions from values to values, with no mitmproxy import, so the addon, the tests and
the CLI share them. ``map_request`` answers one of four values::

    PassThrough   a read (GET, HEAD, OPTIONS without Upgrade or a method override), a
                  Kubernetes watch, a server-side dry run
    Mapped        a write that matches a route: action name and plain-JSON arguments
    Unmapped      a write that matches no route (the upstream's ``unmapped_writes`` decides)
    Invalid       a write ctrlrun cannot read with certainty: refused, nothing forwarded

The built-in tables live in ``stripe_routes`` and ``kube_routes``; ``profile: http``
upstreams use only their own ``routes:``.
"""

from __future__ import annotations

import dataclasses
import unicodedata
from typing import Any

from .config import Upstream
from .field_names import check_names
from .framing import unframed
from .kube_proxies import check_road, through_proxy, unrouted
from .kube_routes import map_kubernetes
from .kube_stream import STREAM_ACTIONS, map_kube_stream
from .numbers import check_doubles
from .route_values import (
    MAX_BODY,
    WRITE_METHODS,
    BadInput,
    Invalid,
    Mapped,
    PassThrough,
    Request,
    RouteResult,
    Unmapped,
    body_override,
    check_arguments,
    check_body,
    compile_path,
    hidden_write,
    load_json,
    match_path,
    media_type,
    overridden,
    path_segments,
    shown,
    unreadable,
)
from .stripe_routes import FORM, REFUND_ROADS, map_stripe, parse_form
from .stripe_routes import ROUTES as STRIPE_ROUTES

__all__ = [
    "MAX_BODY",
    "Invalid",
    "Mapped",
    "PassThrough",
    "Request",
    "RouteResult",
    "Unmapped",
    "map_request",
]

# Go's net/url reads no query of more than 10,000 parameters (urlmaxqueryparams, since Go
# 1.24.12 and 1.25.6): the apiserver then sees none, not the dryRun=All that ctrlrun adds to
# ask what a write would do, so that question is the write itself. PHP stops at 1,000.
MAX_QUERY_PARAMETERS = 1000


def map_request(upstream: Upstream, request: Request) -> RouteResult:
    """Say what ``request``, sent to ``upstream``, is; never raises.

    Reads pass through before anything is parsed; a read with a body, and any request with
    a header folded over two lines, is ``Invalid`` (``unreadable``). A write is matched
    against the profile's routes; only a matched write has its body read (at most
    ``MAX_BODY`` bytes), and any doubt about it is ``Invalid``.
    """
    refused = unreadable(request) or unframed(request) or _half_upgrade(request)
    if refused is not None:
        return Invalid(refused)
    # Through the apiserver's proxy a GET reaches the application, which may act on it.
    through = through_proxy(upstream, request.path)
    if not through and hidden_write(request.method, request.headers, request.query) is None:
        if upstream.profile == "kubernetes" and _is_watch(request):
            return PassThrough("a Kubernetes watch is a read")
        return PassThrough(f"{request.method} is a read")
    if request.raw_query.count("&") >= MAX_QUERY_PARAMETERS:
        return Invalid(
            f"the query has more than {MAX_QUERY_PARAMETERS:,} parameters, past which servers "
            "stop reading it; send fewer"
        )
    method = request.method.upper()
    override = overridden(request.headers, request.query) or body_override(request)
    if override is not None:
        # The remote may apply the override or the method: ctrlrun cannot know which.
        return Invalid(
            f"the request carries {override}: the remote may apply another method than "
            f"{method} (or another path); send that method itself"
        )
    if through:
        return _map_through(upstream, request)
    upgrade = "upgrade" in request.headers
    if method not in WRITE_METHODS and not upgrade:
        # Neither a read nor a write we know: treated as a write that no route maps.
        return Unmapped(f"{shown(request.method)} is not a method ctrlrun maps")
    if method != request.method:
        request = dataclasses.replace(request, method=method)
    try:
        segments = path_segments(request.path)
        result = _map_profile(upstream, request, segments)
    except BadInput as exc:
        return Invalid(exc.reason)
    if isinstance(result, Unmapped) and upstream.profile in ("stripe", "http"):
        near = _near_route(upstream, method, segments)
        if near is not None:
            return Invalid(
                f"{method} {shown(request.path)} is not the path of route {near} as written, "
                "but a server may read it as that route (ignoring case or a '.format' suffix, or "
                "folding Unicode); "
                "send the route's own path"
            )
    if upgrade and isinstance(result, Unmapped):
        # Forwarding it would need a relay ctrlrun keeps for the actions it decides.
        return Invalid(
            f"{method} {shown(request.path)} asks to upgrade the connection and no route maps "
            f"it; ctrlrun relays upgrades only for {', '.join(STREAM_ACTIONS)}"
        )
    return result


def _half_upgrade(request: Request) -> str | None:
    """``Connection: upgrade`` without an ``Upgrade`` header: Go's apiserver takes the first
    alone for an upgrade (``httpstream.IsUpgradeRequest``) and hands the connection on to the
    kubelet; ctrlrun cannot say what the far end makes of it, so it is no read and no write."""
    if "upgrade" in request.headers:
        return None
    if "connection" in request.repeated:  # only the last is in ``headers``: any may say it
        return "the request has more than one Connection header; send one"
    if "upgrade" not in request.headers.get("connection", "").casefold():
        return None
    return (
        "the request says Connection: upgrade without an Upgrade header, which servers read "
        "differently (Go's apiserver as an upgrade); send both, or neither"
    )


def _map_profile(upstream: Upstream, request: Request, segments: list[str]) -> RouteResult:
    if upstream.profile == "stripe":
        return map_stripe(request, segments)
    if upstream.profile == "kubernetes":
        return map_kube_stream(upstream, request, segments) or map_kubernetes(
            upstream, request, segments
        )
    return _map_http(upstream, request, segments)


def _map_through(upstream: Upstream, request: Request) -> RouteResult:
    """A request through the apiserver's proxy: the route that maps it, else refused."""
    try:
        segments = path_segments(request.path)
        check_road(upstream, request, segments)
        result = _map_http(upstream, request, segments)
    except BadInput as exc:
        return Invalid(exc.reason)
    if isinstance(result, Unmapped):
        near = _near_route(upstream, request.method, segments)
        # A route as written, or nothing: the application may ignore case or a '.json'.
        also = "" if near is None else f" (route {near} is not this path as written)"
        return Invalid(unrouted(request, segments) + also)
    return result


def _near_route(upstream: Upstream, method: str, segments: list[str]) -> str | None:
    """A route this unmapped write may be to a server that matches paths loosely: ASP.NET
    ignores case, Rails takes '/send.json' for '/send'. Under ``unmapped_writes: allow`` it
    would be forwarded undecided."""
    if upstream.profile == "stripe":
        routes = [(m, template, action) for m, template, action in STRIPE_ROUTES]
        routes += [
            (m, template, "a refund")
            for m, template, _ in REFUND_ROADS
            if match_path(template, segments) is None  # as written, map_stripe judged it
        ]
    else:
        routes = [(r.method.upper(), r.path, r.action) for r in upstream.routes]
    forms = [_loose(segments), _loose(_decoded_again(segments))]
    for route_method, template, action in routes:
        compiled = compile_path(template)
        if route_method != method or compiled is None:
            continue
        for loose in forms:
            if len(compiled) == len(loose) and all(
                is_param or text.casefold() == got
                for (is_param, text), got in zip(compiled, loose, strict=True)
            ):
                return f"{route_method} {template} ({action})"
    return None


def _loose(segments: list[str]) -> list[str]:
    loose = [segment.casefold().rstrip(" .") for segment in segments]  # IIS drops those
    if loose:
        loose[-1] = loose[-1].rsplit(".", 1)[0] if "." in loose[-1][1:] else loose[-1]
    return loose


def _decoded_again(segments: list[str]) -> list[str]:
    """The path as a server that folds Unicode reads it (NFKC: 'ｓend' is 'send', a no-break
    space a space), a '+' as the space PHP's and form decoders make of it. ('%', '?' and '#'
    are refused in a path already: decoded again, they are another path.)"""
    return [unicodedata.normalize("NFKC", s.replace("+", " ")) for s in segments]


def _is_watch(request: Request) -> bool:
    return any(value in ("true", "1") for value in request.query.get("watch", ()))


def _map_http(upstream: Upstream, request: Request, segments: list[str]) -> RouteResult:
    """``profile: http``: the first of the upstream's routes that matches wins."""
    for route in upstream.routes:
        if route.method.upper() != request.method:
            continue
        params = match_path(route.path, segments)
        if params is None:
            continue
        check_body(request)
        arguments = _http_fields(request)
        _add_query(arguments, request)
        for name, value in params.items():
            given = arguments.get(name, value)
            if given != value and not (type(given) is int and str(given) == value):
                raise BadInput(f"the path says {name}={value!r} but the body says {given!r}")
            arguments[name] = value
        check_names(arguments)
        check_arguments(arguments)
        return Mapped(route.action, arguments)
    return Unmapped(
        f"no route of upstream {upstream.name!r} maps {request.method} {shown(request.path)}"
    )


def _add_query(arguments: dict[str, Any], request: Request) -> None:
    """The query's parameters are arguments too: many servers (Flask's ``request.values``,
    Spring's ``@RequestParam``, PHP's ``$_REQUEST``) read them beside the body's fields, so a
    write's query must not hold what ctrlrun never saw. A name in both is refused."""
    for name, values in request.query.items():
        if ";" in name or any(";" in value for value in values):
            # Rack before 3 splits a query on ';' as on '&': "order=x;order=o1" is order o1
            # there (the last wins), a fresh effect key here.
            raise BadInput(f"the query parameter {shown(name, 40)} holds a ';'")
        if name in arguments:
            raise BadInput(f"{shown(name)} is given in both the query and the body")
        arguments[name] = values[0] if len(values) == 1 else list(values)


def _http_fields(request: Request) -> dict[str, Any]:
    """A JSON object body's fields, or form fields (a repeated name gives a list)."""
    if not request.body:
        return {}
    kind = media_type(request.headers)
    if kind == "application/json" or kind.endswith("+json"):
        body = load_json(request.body, floats=False, folded=True)
        if not isinstance(body, dict):
            raise BadInput("the JSON body must be an object to give named arguments")
        check_doubles(body, "the JSON body")
        return body
    if kind == FORM:
        if request.body.lstrip(b" \t\r\n")[:1] in (b"{", b"["):
            # Many Go and Node handlers decode the body as JSON whatever its Content-Type, and
            # '{"amount":900000,"a":"=&amount=5&b="}' is a form of amount=5 as well.
            raise BadInput("the form body is a JSON document too; send it as application/json")
        fields: dict[str, Any] = {}
        for key, value in parse_form(request.body):
            if key not in fields:
                fields[key] = value
            elif isinstance(fields[key], list):
                fields[key].append(value)
            else:
                fields[key] = [fields[key], value]
        return fields
    # The body is part of the action; one ctrlrun cannot read would go unrecorded.
    raise BadInput(
        f"cannot read a body of type {shown(kind or 'untyped')}; "
        "ctrlrun reads JSON objects and form fields"
    )
