"""The apiserver's proxies: paths through which it relays a request to a workload itself::

    /api/v1/namespaces/{namespace}/pods/{pod}[:{port}]/proxy[/{path}]
    /api/v1/namespaces/{namespace}/services/[{scheme}:]{service}[:{port}]/proxy[/{path}]
    /api/v1/nodes/{node}[:{port}]/proxy[/{path}]      (the kubelet)
    /api/v1/proxy/..., /api/v1/redirect/...           (the same, before Kubernetes 1.10)

What the request does there is the application's to say, not the apiserver's: a GET may send
an invoice or drop a table, so no method is a read. Each one is refused, with any Upgrade,
unless one of the upstream's own ``routes:`` maps it (method and path as written), and then
it is that route's action, decided by the policy as any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import unquote

from .config import Upstream
from .route_values import BadInput, Request, compile_path, match_path, shown

_NAMED = ("pods", "services")


def road(segments: Sequence[str]) -> tuple[str, int] | None:
    """What the path reaches through a proxy ('pod', 'service', 'node', or 'proxy' for the
    old form) and the index of the segment naming it; None for any other path.

    Keywords are compared in any case (an apiserver that matched them so would relay, and
    refusing more is the safe side); names are as written.
    """
    words = [segment.casefold() for segment in segments]
    match words:
        case ["api", _, "namespaces", _, kind, _, "proxy", *_] if kind in _NAMED:
            return kind[:-1], 5
        case ["api", _, "nodes", _, "proxy", *_]:
            # The apiserver relays these to the kubelet with its own client certificate, which
            # the kubelet obeys: POST /run/{namespace}/{pod}/{container}?cmd=... runs a command
            # with no Upgrade (an exec by another road); /exec, /attach, /portForward,
            # /checkpoint and /debug/flags are as strong.
            return "node", 3
        case ["api", _, "proxy" | "redirect", *_]:
            return words[2], 2
        case _:
            return None


def through_proxy(upstream: Upstream, path: str) -> bool:
    """Whether a request to ``upstream`` goes through the apiserver's proxy: then even a
    read is judged (refused unless a route maps it)."""
    return upstream.profile == "kubernetes" and reaches_workload(path)


def reaches_workload(path: str) -> bool:
    """Whether ``path``, read as Go's apiserver reads it (escapes decoded once, so an encoded
    '/' is a separator; empty and '.' segments dropped, '..' going up), goes through a proxy.

    Lenient on purpose: it decides whether any request, a read included, is judged at all."""
    folded = path.casefold()
    if "proxy" not in folded and "redirect" not in folded and "%" not in folded:
        return False  # the hot path: most reads
    segments: list[str] = []
    for part in unquote(path.partition("?")[0]).replace("\\", "/").split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if segments:
                segments.pop()
            continue
        segments.append(part)
    return road(segments) is not None


def check_road(upstream: Upstream, request: Request, segments: list[str]) -> None:
    """Raise ``BadInput`` for a request through a proxy that no route of ``upstream`` may map
    as written: an upgrade, or a name spelt with a port or scheme where a route reads it."""
    found = road(segments)
    if found is None:
        # The strict segments are no proxy path, yet the lenient reading was: refuse.
        raise BadInput(f"the path {shown(request.path)} may reach a proxy of the apiserver")
    kind, at = found
    if "upgrade" in request.headers:
        raise BadInput(
            f"{request.method} {shown(request.path)} asks to upgrade a connection through the "
            f"apiserver's proxy to a {kind}; ctrlrun relays upgrades only for a pod's exec, "
            "attach and portforward"
        )
    name = segments[at] if at < len(segments) else ""
    if ":" not in name:
        return
    for route in upstream.routes:
        compiled = compile_path(route.path)
        if route.method.upper() != request.method or match_path(route.path, segments) is None:
            continue
        if compiled is not None and compiled[at][0]:
            # "web", "web:80" and "http:web:" are one service: a route's {service} keyed
            # by each spelling would let the same call through under three effect keys.
            raise BadInput(
                f"the path names {kind} {shown(name, 60)} with a port or scheme, which route "
                f"{route.method} {route.path} reads as a parameter; name it as written in "
                "the route, or without them"
            )


def unrouted(request: Request, segments: Sequence[str]) -> str:
    """Why a request through a proxy that no route maps is refused."""
    kind, at = road(segments) or ("workload", 0)
    name = shown(segments[at], 60) if at and at < len(segments) else "it"
    reached = {
        "node": f"the kubelet of node {name}, which runs commands in its pods",
        "proxy": "a pod, service or node's kubelet (the form before Kubernetes 1.10)",
        "redirect": "a pod, service or node (the form before Kubernetes 1.10)",
    }.get(kind, f"{kind} {name} itself, whose application may act on any method")
    return (
        f"{request.method} {shown(request.path)} goes through the apiserver's proxy to "
        f"{reached}; ctrlrun forwards it only when one of the upstream's routes maps it"
    )


def route_path_error(template: str) -> str | None:
    """Why a ``profile: kubernetes`` route's path cannot be one (None when it can): such
    routes map only requests through a proxy, whose keywords are written, not parameters."""
    compiled = compile_path(template)
    if compiled is None:
        return "must be a path of whole segments"
    # A parameter in a keyword's place ("pods/{x}/{sub}") matches no keyword; the forms
    # before Kubernetes 1.10 are no route's (their names, ports and all, sit elsewhere).
    found = road(["{}" if is_param else text for is_param, text in compiled])
    if found is not None and found[0] in ("pod", "service", "node"):
        return None
    return (
        "a kubernetes route maps only a path through the apiserver's proxy: "
        "/api/v1/namespaces/{namespace}/pods/{pod}/proxy/..., .../services/{service}/proxy/..."
        " or /api/v1/nodes/{node}/proxy/..."
    )
