"""The built-in routes of ``profile: kubernetes``: writes of apps/v1 workloads, and deletes.

A PATCH or PUT of a Deployment, StatefulSet or ReplicaSet, or of its ``/scale``, is a
``KubeWrite``: what it does depends on the object it meets and on the apiserver's merge, so
``kube_result`` decides it on the apiserver's own dry run. Here its body is only read
strictly (JSON without floats or repeated keys; an apply document as YAML) and its patch type
checked. A collection delete has no object to decide on: it is refused.
"""

from __future__ import annotations

from typing import Any

from .config import Upstream
from .kube_roads import refuse_other_roads
from .kube_writes import WORKLOADS, read_document
from .route_values import (
    BadInput,
    KubeWrite,
    Mapped,
    PassThrough,
    Request,
    RouteResult,
    Unmapped,
    check_arguments,
    check_body,
    load_json,
    shown,
)


def map_kubernetes(upstream: Upstream, request: Request, segments: list[str]) -> RouteResult:
    """Map a Kubernetes write onto its action, or say why not."""
    cluster = upstream.cluster or upstream.name
    method = request.method
    write: KubeWrite | None = None
    arguments: dict[str, Any]
    refuse_other_roads(request, segments)
    match segments:
        case ["api", "v1", "namespaces", name] if method == "DELETE":
            action, arguments = "k8s.delete_namespace", {"cluster": cluster, "name": name}
        case ["apis", "apps", "v1", "namespaces", namespace, "deployments", deployment] if (
            method == "DELETE"
        ):
            action = "k8s.delete_deployment"
            arguments = {"cluster": cluster, "namespace": namespace, "deployment": deployment}
        case ["apis", "apps", "v1", "namespaces", namespace, kind, name, *rest] if (
            kind in WORKLOADS and rest in ([], ["scale"]) and method in ("PATCH", "PUT")
        ):
            action = ""
            singular = WORKLOADS[kind]
            arguments = {
                "cluster": cluster,
                "namespace": namespace,
                singular: name,
                "workload": f"{singular}/{name}",
            }
            write = KubeWrite(kind, namespace, name, rest == ["scale"], "", None, arguments)
        case _:
            return _unmapped(request)
    check_body(request)
    dry = request.query.get("dryRun")
    if dry is not None and not _all_dry(dry):
        # ctrlrun asks its own question with "&dryRun=All" beside these: an apiserver that
        # took "all" or a blank for a real write would apply the write while ctrlrun asks.
        raise BadInput(
            f"dryRun is {shown(','.join(dry), 40)}: the apiserver accepts only dryRun=All"
        )
    # A dry run is passed through only on these paths: they are served by the apiserver's
    # own handlers, which honour dryRun. Elsewhere (pods/exec, services/proxy, aggregated
    # APIs) the parameter may be ignored, and passing it through would let a write by.
    if _dry_run(request):
        return PassThrough("dryRun=All: a server-side dry run persists nothing")
    check_arguments(arguments)
    if write is not None:
        media, document = read_document(request)
        return KubeWrite(
            write.kind, write.namespace, write.name, write.scale, media, document, arguments
        )
    return Mapped(action, arguments)


def _unmapped(request: Request) -> Unmapped:
    return Unmapped(f"no Kubernetes route maps {request.method} {shown(request.path)}")


def _dry_run(request: Request) -> bool:
    if request.method == "DELETE" and request.body:
        # The apiserver reads DeleteOptions from a non-empty body and then ignores the query,
        # so "?dryRun=All" beside a body is a real delete. A body ctrlrun cannot read (say,
        # protobuf) is not proof of a dry run: the delete stays protected.
        try:
            options = load_json(request.body, floats=True, folded=True)
        except BadInput:
            return False
        return isinstance(options, dict) and _all_dry(options.get("dryRun"))
    return _all_dry(request.query.get("dryRun"))


def _all_dry(values: Any) -> bool:
    # "All" is the only value the apiserver accepts; anything else is rejected or not a dry run.
    return isinstance(values, list) and bool(values) and all(value == "All" for value in values)
