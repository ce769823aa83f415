"""The Kubernetes writes that open a stream: ``exec``, ``attach`` and ``portforward`` of a pod.

kubectl opens them as ``GET`` with ``Upgrade: websocket`` (1.30+) or as ``POST`` (or ``GET``)
with ``Upgrade: SPDY/3.1``; both forms run a command in a container or open its ports, so
both are the same action. Their options are query parameters only: the apiserver decodes
``PodExecOptions`` and friends from the query and never from a body.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .config import Upstream
from .route_values import (
    BadInput,
    Mapped,
    Request,
    RouteResult,
    check_arguments,
    shown,
    unquote_strict,
)

STREAM_ACTIONS = ("k8s.exec", "k8s.attach", "k8s.port_forward")
_SUBRESOURCES = {"exec": "k8s.exec", "attach": "k8s.attach", "portforward": "k8s.port_forward"}
_MAX_PORT = 65535


def map_kube_stream(
    upstream: Upstream, request: Request, segments: list[str]
) -> RouteResult | None:
    """The action of a pod's exec, attach or portforward; None for any other path."""
    match segments:
        case ["api", "v1", "namespaces", namespace, "pods", pod, sub] if sub in _SUBRESOURCES:
            pass
        case _:
            return None
    if request.method not in ("GET", "POST"):
        return None  # the apiserver connects only these two: any other method is unmapped
    query = _strict_query(request)
    action = _SUBRESOURCES[sub]
    arguments: dict[str, Any] = {
        "cluster": upstream.cluster or upstream.name,
        "namespace": namespace,
        "pod": pod,
    }
    if action == "k8s.port_forward":
        arguments["ports"] = _ports(query.get("ports", []))
        if arguments["ports"] and _ports_in_stream(request):
            # Over SPDY (or SPDY tunnelled in a WebSocket, as kubectl 1.31+ sends it) the
            # kubelet forwards the port each stream's header names and never reads the query:
            # ?ports=8080 would be decided while 5432 is forwarded.
            raise BadInput(
                "this port-forward names its ports inside the stream (SPDY), where the kubelet "
                "reads them, not in the query ctrlrun decides; send it without ports= in the "
                "query, or as a WebSocket of the channel protocol"
            )
    else:
        arguments["container"] = _single(query, "container")
    if action == "k8s.exec":
        arguments["command"] = list(query.get("command", []))
    check_arguments(arguments)
    return Mapped(action, arguments)


def _ports_in_stream(request: Request) -> bool:
    """Whether the port-forward may be SPDY, whose streams name their own ports."""
    upgrade = request.headers.get("upgrade", "").strip().casefold()
    offered = request.headers.get("sec-websocket-protocol", "").casefold()
    return (
        upgrade != "websocket"
        or "spdy" in offered
        or bool({"upgrade", "sec-websocket-protocol"} & request.repeated)
    )


def _strict_query(request: Request) -> Mapping[str, list[str]]:
    # Go's net/url drops a pair with a malformed escape and reads on, where Python keeps it
    # as written: "command=%zz&command=sh" runs ["sh"] at the apiserver, a command ctrlrun
    # would have decided as ["%zz", "sh"]. Refused, as is bad UTF-8 once decoded.
    for pair in request.raw_query.split("&"):
        try:
            unquote_strict(pair, plus=True)
        except BadInput as exc:
            raise BadInput(
                f"the query pair {shown(pair, 60)} has a malformed escape or is not UTF-8: "
                "the apiserver would drop it and read the rest"
            ) from exc
    # Python splits a query on "&" only; Go refuses a pair holding ";" and drops it. A
    # ";command=rm" would read as one argument here and as nothing there: refused.
    query = request.query
    for key, values in query.items():
        if ";" in key or any(";" in value for value in values):
            raise BadInput(
                f"the query parameter {shown(key)} contains ';', which servers split differently"
            )
    return query


def _single(query: Mapping[str, list[str]], name: str) -> str | None:
    values = query.get(name, [])
    if len(values) > 1:
        raise BadInput(f"the query gives {name} {len(values)} times")
    return values[0] if values and values[0] else None


def _ports(values: list[str]) -> list[int]:
    """The ports named in the query (empty when a stream header names them instead)."""
    ports = []
    for value in values:
        for part in value.split(","):
            text = part.strip()
            if not text.isdigit() or not 0 < int(text) <= _MAX_PORT:
                raise BadInput(f"ports must be numbers from 1 to {_MAX_PORT}, got {shown(part)}")
            ports.append(int(text))
    return ports
