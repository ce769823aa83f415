"""The built-in routes of ``profile: kubernetes``: scales and deletes of the apps/v1 API."""

from __future__ import annotations

from typing import Any

from .config import Upstream
from .route_values import (
    BadInput,
    Mapped,
    PassThrough,
    Request,
    RouteResult,
    Unmapped,
    check_arguments,
    check_body,
    load_json,
    media_type,
    shown,
)

MERGE_PATCHES = frozenset(
    {"application/merge-patch+json", "application/strategic-merge-patch+json"}
)
JSON_PATCH = "application/json-patch+json"
REPLICAS_PATH = "/spec/replicas"
_MAX_REPLICAS = 2**31 - 1  # spec.replicas is an int32


def map_kubernetes(upstream: Upstream, request: Request, segments: list[str]) -> RouteResult:
    """Map a Kubernetes write onto its action, or say why not."""
    cluster = upstream.cluster or upstream.name
    method = request.method
    arguments: dict[str, Any]
    match segments:
        case ["api", "v1", "namespaces", name] if method == "DELETE":
            action, arguments = "k8s.delete_namespace", {"cluster": cluster, "name": name}
        case ["apis", "apps", "v1", "namespaces", namespace, "deployments", deployment, "scale"]:
            if method not in ("PATCH", "PUT"):
                return _unmapped(request)
            action = "k8s.scale"
            arguments = {"cluster": cluster, "namespace": namespace, "deployment": deployment}
        case ["apis", "apps", "v1", "namespaces", namespace, "deployments", deployment]:
            if method not in ("PATCH", "DELETE"):
                return _unmapped(request)  # a PUT replaces the whole Deployment: not a scale
            action = "k8s.scale" if method == "PATCH" else "k8s.delete_deployment"
            arguments = {"cluster": cluster, "namespace": namespace, "deployment": deployment}
        case _:
            return _unmapped(request)
    check_body(request)
    # A dry run is passed through only on these paths: they are served by the apiserver's
    # own handlers, which honour dryRun. Elsewhere (pods/exec, services/proxy, aggregated
    # APIs) the parameter may be ignored, and passing it through would let a write by.
    if _dry_run(request):
        return PassThrough("dryRun=All: a server-side dry run persists nothing")
    if action == "k8s.scale":
        subresource = segments[-1] == "scale"
        result = _replicas(request, subresource=subresource)
        if not isinstance(result, int):
            return result
        arguments["replicas"] = result
    check_arguments(arguments)
    return Mapped(action, arguments)


def _unmapped(request: Request) -> Unmapped:
    return Unmapped(f"no Kubernetes route maps {request.method} {shown(request.path)}")


def _dry_run(request: Request) -> bool:
    if request.method == "DELETE" and request.body:
        # The apiserver reads DeleteOptions from a non-empty body and then ignores the query,
        # so "?dryRun=All" beside a body is a real delete. A body ctrlrun cannot read (say,
        # protobuf) is not proof of a dry run: the delete stays protected.
        try:
            options = load_json(request.body, floats=True)
        except BadInput:
            return False
        return isinstance(options, dict) and _all_dry(options.get("dryRun"))
    return _all_dry(request.query.get("dryRun"))


def _all_dry(values: Any) -> bool:
    # "All" is the only value the apiserver accepts; anything else is rejected or not a dry run.
    return isinstance(values, list) and bool(values) and all(value == "All" for value in values)


def _replicas(request: Request, *, subresource: bool) -> int | Unmapped:
    """The replica count a scale write sets; Unmapped when the write is not a pure scale."""
    kind = media_type(request.headers)
    if kind.startswith("application/apply-patch"):
        return Unmapped(
            "server-side apply is not mapped to k8s.scale: an apply document may set any field "
            "and may create the object; scale with 'kubectl scale' or a merge patch "
            '{"spec":{"replicas":N}}'
        )
    if request.method == "PUT":
        if kind not in ("application/json", ""):
            raise BadInput(f"cannot read a PUT Scale body of type {shown(kind)}; send JSON")
        scale = _object(request.body)
        spec = scale.get("spec")
        if not isinstance(spec, dict) or "replicas" not in spec:
            # Go decodes a missing spec.replicas as 0: this PUT would scale to zero.
            raise BadInput("a PUT Scale without spec.replicas would scale to 0; set it")
        return _count(spec["replicas"])
    if kind in MERGE_PATCHES:
        return _from_merge_patch(_object(request.body), subresource=subresource)
    if kind == JSON_PATCH:
        return _from_json_patch(load_json(request.body, floats=True), subresource=subresource)
    raise BadInput(
        f"cannot read a PATCH body of type {shown(kind or 'untyped')}; "
        f"send {JSON_PATCH} or a merge patch"
    )


def _from_merge_patch(patch: dict[str, Any], *, subresource: bool) -> int | Unmapped:
    spec = patch.get("spec")
    if not subresource and (
        set(patch) != {"spec"} or not isinstance(spec, dict) or set(spec) != {"replicas"}
    ):
        # Anything beside spec.replicas (an image, a label, a $patch directive) makes this a
        # different change that happens to scale too; it is not the k8s.scale action.
        return Unmapped("this Deployment PATCH changes more than spec.replicas: not a pure scale")
    if not isinstance(spec, dict) or "replicas" not in spec:
        raise BadInput("a scale PATCH must set spec.replicas")
    return _count(spec["replicas"])


def _from_json_patch(ops: Any, *, subresource: bool) -> int | Unmapped:
    if not isinstance(ops, list):
        raise BadInput("a JSON patch must be a list of operations")
    sets: list[dict[str, Any]] = []
    others = 0
    for op in ops:
        if not isinstance(op, dict) or not isinstance(op.get("op"), str):
            raise BadInput("a JSON patch operation must be an object with an 'op'")
        if not isinstance(op.get("path"), str):
            raise BadInput(f"JSON patch operation {shown(op['op'])} has no 'path'")
        if op["op"] == "test":
            continue  # a precondition: it changes nothing
        if op["op"] in ("replace", "add") and op["path"] == REPLICAS_PATH:
            sets.append(op)
        else:
            others += 1
    if others:
        return Unmapped("this JSON patch changes more than /spec/replicas: not a pure scale")
    if not sets:
        if subresource:
            raise BadInput("a scale JSON patch must replace /spec/replicas")
        return Unmapped("this JSON patch does not set /spec/replicas")
    if len(sets) > 1:
        raise BadInput("the JSON patch sets /spec/replicas more than once")
    if "value" not in sets[0]:
        raise BadInput("the JSON patch operation on /spec/replicas has no 'value'")
    return _count(sets[0]["value"])


def _object(body: bytes) -> dict[str, Any]:
    value = load_json(body, floats=True)
    if not isinstance(value, dict):
        raise BadInput("the body must be a JSON object")
    return value


def _count(value: Any) -> int:
    # Floats (6.0), bools (true is 1 to Python), strings and nulls are all refused.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_REPLICAS:
        raise BadInput(f"replicas must be a non-negative integer, got {shown(repr(value))}")
    return value
