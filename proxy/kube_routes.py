"""The built-in routes of ``profile: kubernetes``: writes of apps/v1 workloads, and deletes.

A PATCH or PUT of a Deployment, StatefulSet or ReplicaSet, or of its ``/scale``, is a
``KubeWrite``: what it does depends on the object it meets and on the apiserver's merge, so
``kube_result`` decides it on the apiserver's own dry run. Here its body is only read
strictly (JSON without floats or repeated keys; an apply document as YAML) and its patch type
checked. A collection delete has no object to decide on: it is refused.
"""

from __future__ import annotations

from typing import Any

import yaml

from .config import Upstream
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
    media_type,
    shown,
)

# The patch types the apiserver accepts for these objects, by the name kube_result uses.
PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/json-patch+json": "json",
    "application/apply-patch+yaml": "apply",
}
# The apps/v1 workloads that have replicas, and the argument that names each one.
WORKLOADS = {
    "deployments": "deployment",
    "statefulsets": "statefulset",
    "replicasets": "replicaset",
}


def map_kubernetes(upstream: Upstream, request: Request, segments: list[str]) -> RouteResult:
    """Map a Kubernetes write onto its action, or say why not."""
    cluster = upstream.cluster or upstream.name
    method = request.method
    write: KubeWrite | None = None
    arguments: dict[str, Any]
    _refuse_other_roads(method, segments)
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
    # A dry run is passed through only on these paths: they are served by the apiserver's
    # own handlers, which honour dryRun. Elsewhere (pods/exec, services/proxy, aggregated
    # APIs) the parameter may be ignored, and passing it through would let a write by.
    if _dry_run(request):
        return PassThrough("dryRun=All: a server-side dry run persists nothing")
    check_arguments(arguments)
    if write is not None:
        media, document = _document(request)
        return KubeWrite(
            write.kind, write.namespace, write.name, write.scale, media, document, arguments
        )
    return Mapped(action, arguments)


def _refuse_other_roads(method: str, segments: list[str]) -> None:
    """Refuse, whatever ``unmapped_writes`` says, a write that is an action ctrlrun decides
    by another road (an exec through the kubelet or an ephemeral container), or many of them
    at once (a collection delete): forwarded as an unmapped write, it would go undecided."""
    match segments:
        case ["apis", "apps", "v1", "namespaces", namespace, kind] if (
            kind in WORKLOADS and method == "DELETE"
        ):
            # deletecollection: every object the selector matches, none of them named here.
            raise BadInput(
                f"a collection DELETE of {kind} in namespace {namespace!r} is refused: "
                "ctrlrun decides deletes one object at a time; delete each by name"
            )
        case ["api", "v1", "nodes", node, "proxy", *_] | ["api", "v1", "proxy", "nodes", node, *_]:
            # The apiserver relays these to the kubelet with its own client certificate, which
            # the kubelet obeys: POST /run/{namespace}/{pod}/{container}?cmd=... runs a command
            # with no Upgrade (an exec by another road), and its other writes (exec, attach,
            # portForward, checkpoint, debug/flags) are as strong. /api/v1/proxy/ is the form
            # before Kubernetes 1.10.
            raise BadInput(
                f"a {method} through node {node!r}'s proxy reaches its kubelet, which runs "
                "commands in pods; ctrlrun decides those only as pods/{pod}/exec: use it"
            )
        case ["api", "v1", "namespaces", namespace, "pods", pod, "ephemeralcontainers"]:
            # What kubectl debug writes: the kubelet starts each container added here at once,
            # running its command beside the pod's own (inside their processes with a target).
            raise BadInput(
                f"a {method} of pod {pod!r}'s ephemeral containers runs a command in the pod; "
                "ctrlrun decides those only as pods/{pod}/exec: use it"
            )
        case _:
            return


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


def _document(request: Request) -> tuple[str, Any]:
    """The write's patch type and its body, parsed strictly; refuse what cannot be read."""
    kind = media_type(request.headers)
    if request.method == "PUT":
        if kind not in ("application/json", ""):
            raise BadInput(f"cannot read a PUT body of type {shown(kind)}; send JSON")
        media = "put"
    elif kind in PATCH_TYPES:
        media = PATCH_TYPES[kind]
    else:
        raise BadInput(
            f"cannot read a PATCH body of type {shown(kind or 'untyped')}; send a JSON patch, "
            "a merge or strategic merge patch, or an apply patch (YAML or JSON)"
        )
    # ctrlrun forwards its own encoding of what it read, so the dry run and the write carry
    # the same document; floats are refused (nothing in these objects needs one).
    document = _yaml(request.body) if media == "apply" else load_json(request.body, floats=False)
    if media == "json":
        if not isinstance(document, list):
            raise BadInput("a JSON patch must be a list of operations")
    elif not isinstance(document, dict):
        raise BadInput("the body must be a JSON object")
    return media, document


def _yaml(body: bytes) -> Any:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput("the body is not valid UTF-8") from exc
    if text.lstrip().startswith("{"):
        return load_json(body, floats=False)
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise BadInput(f"the apply patch is not valid YAML ({str(exc)[:80]})") from exc
    if len(documents) != 1:
        raise BadInput("an apply patch must hold exactly one YAML document")
    # Re-encoded as JSON below: YAML scalars the apiserver would read differently (yes, 010)
    # reach it as the JSON values ctrlrun decided on. Floats and dates are refused.
    _plain_yaml(documents[0])
    return documents[0]


def _plain_yaml(value: Any) -> None:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if not all(isinstance(k, str) for k in item):
                raise BadInput("the apply patch has a key that is not a string")
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif item is not None and not isinstance(item, (str, int)):
            raise BadInput(f"the apply patch holds a {type(item).__name__}; quote it")
