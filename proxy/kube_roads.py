"""Kubernetes writes that reach what ctrlrun decides by another road, refused whatever
``unmapped_writes`` says: forwarded as unmapped writes, they would go undecided::

    deletecollection                many deletes at once (workloads, namespaces), none named
    pods/{pod}/ephemeralcontainers  what kubectl debug adds: a command started in the pod
    pods/{pod}, beyond metadata     a running pod's new image: new code, started by the kubelet
    horizontalpodautoscalers, KEDA scaledobjects (and their delete), verticalpodautoscalers
                                    a controller scales the target, to counts no request names
    statefulsets/{name}, replicasets/{name} (DELETE), replicationcontrollers
                                    the workload and its pods go (or its replicas are set)
    customresourcedefinitions (DELETE)
                                    every object of the kind goes, and what they own
    .../{name}/scale of any group but apps/v1
                                    a custom resource's replicas, set for its operator
    an owner for a namespace, or for a workload through its /status
                                    the garbage collector deletes it once its owner is gone
    extensions/v1beta1, apps/v1beta1, apps/v1beta2
                                    the workloads ctrlrun decides, by the names of old clusters

A request through the apiserver's proxy (a pod's, a service's, a node's kubelet) is refused
before any of these, whatever its method (``kube_proxies``).
"""

from __future__ import annotations

from typing import Any

from .kube_writes import WORKLOADS, read_document
from .route_values import BadInput, Request, check_body, shown

# The groups that served Deployments, StatefulSets and ReplicaSets before apps/v1 (removed in
# Kubernetes 1.16): a cluster that still serves them applies a scale or a delete there.
OLD_GROUPS = (("extensions", "v1beta1"), ("apps", "v1beta1"), ("apps", "v1beta2"))
_EXEC = "ctrlrun decides those only as pods/{pod}/exec: use it"
# The autoscalers whose controllers set a workload's replicas (VPA: its pods' resources,
# evicting them to apply those), by (group, plural).
AUTOSCALERS = {
    ("autoscaling", "horizontalpodautoscalers"): "HorizontalPodAutoscaler",
    ("keda.sh", "scaledobjects"): "KEDA ScaledObject",
    ("autoscaling.k8s.io", "verticalpodautoscalers"): "VerticalPodAutoscaler",
}


def refuse_other_roads(request: Request, segments: list[str]) -> None:
    """Raise ``BadInput`` for a write that is an action ctrlrun decides by another road."""
    method = request.method
    match segments:
        case ["apis", "apps", "v1", "namespaces", namespace, kind] if (
            kind in WORKLOADS and method == "DELETE"
        ):
            raise BadInput(
                f"a collection DELETE of {kind} in namespace {namespace!r} is refused: "
                "ctrlrun decides deletes one object at a time; delete each by name"
            )
        case ["api", "v1", "namespaces"] if method == "DELETE":
            # Served before Kubernetes 1.11 (the store's own delete, not the namespace's).
            raise BadInput(
                "a collection DELETE of namespaces is refused: ctrlrun decides deletes one "
                "object at a time; delete each by name"
            )
        case ["api", "v1", "namespaces", _, "pods", pod, "ephemeralcontainers"]:
            # What kubectl debug writes: the kubelet starts each container added here at once,
            # running its command beside the pod's own (inside their processes with a target).
            raise BadInput(
                f"a {method} of pod {pod!r}'s ephemeral containers runs a command in the pod; "
                f"{_EXEC}"
            )
        case ["api", "v1", "namespaces", _, "pods", pod] if method in ("PATCH", "PUT"):
            # A pod's images may change while it runs: the kubelet restarts the container
            # with the new one, code of the writer's choosing running in the pod at once.
            if not _metadata_only(request):
                raise BadInput(
                    f"this {method} of pod {pod!r} writes more than its metadata (a container's "
                    "image runs new code in the pod); send a PATCH of its labels or "
                    f"annotations only, and {_EXEC}"
                )
        case _:
            _refuse_controlled(request, segments)


def _refuse_controlled(request: Request, segments: list[str]) -> None:
    """Writes a controller, or an older API group, turns into a scale or a delete."""
    method = request.method
    match segments:
        case ["apis", group, _, "namespaces", _, plural, *rest] if (
            (group, plural) in AUTOSCALERS
        ) and (
            (rest == [] and method == "POST")
            or (len(rest) == 1 and method in ("PATCH", "PUT") and not _metadata_only(request))
            or (len(rest) == 1 and method == "DELETE" and group == "keda.sh")
        ):
            # The controller sets the target's replicas between minReplicas and maxReplicas,
            # now and whenever its metrics move: scales no request names, that a policy on
            # k8s.scale never sees. Deleting an HPA leaves the replicas where they are; KEDA
            # restores the target's original count (restoreToOriginalReplicaCount).
            raise BadInput(
                f"a {method} of a {AUTOSCALERS[group, plural]} has its controller scale the "
                "target (or evict and resize its pods) to counts ctrlrun never decides; "
                "ctrlrun decides replicas only as k8s.scale (kubectl scale)"
            )
        case _ if method in ("PATCH", "PUT") and _ownable(segments) and _owned(request):
            # The status (and finalize) subresources reset the spec, not the owners: a
            # workload's /status writes them as its own path does, which ctrlrun decides.
            name = segments[3] if segments[0] == "api" else segments[6]
            raise BadInput(
                f"this {method} gives {name!r} an owner (metadata.ownerReferences): the garbage "
                "collector deletes it once that owner is gone; ctrlrun decides deletes only "
                "by name"
            )
        case ["apis", group, version, "namespaces", _, kind, *rest] if (
            (group, version) in OLD_GROUPS and kind in WORKLOADS and (rest or method != "POST")
        ):
            raise BadInput(
                f"a {method} of {kind} through {group}/{version} is refused: ctrlrun decides "
                f"workload writes through apps/v1 only; send it to /apis/apps/v1/..."
            )
        case _:
            _refuse_cascades(request, segments)


def _refuse_cascades(request: Request, segments: list[str]) -> None:
    """Deletes that take what ctrlrun decides with them, and scales of other kinds."""
    method = request.method
    match segments:
        case ["apis", "apps", "v1", "namespaces", _, "statefulsets" | "replicasets", name] if (
            method == "DELETE"
        ):
            # Its pods go with it (Background or Foreground), or stay ownerless (Orphan): the
            # workload whose replicas ctrlrun decides is gone either way.
            raise BadInput(
                f"a DELETE of {WORKLOADS[segments[5]]} {name!r} removes its pods with it; "
                "ctrlrun decides its replicas as k8s.scale and deletes only of deployments "
                "and namespaces"
            )
        case ["api", "v1", "namespaces", _, "replicationcontrollers", name, *rest] if (
            (method == "DELETE" and not rest)
            or (method in ("PATCH", "PUT") and rest == ["scale"])
            or (method in ("PATCH", "PUT") and not rest and not _metadata_only(request))
        ):
            raise BadInput(
                f"a {method} of ReplicationController {name!r} sets or removes its pods; "
                "ctrlrun decides replicas only of apps/v1 workloads: use a Deployment"
            )
        case ["apis", "apiextensions.k8s.io", _, "customresourcedefinitions", *rest] if (
            method == "DELETE" and len(rest) <= 1
        ):
            # Every object of the kind goes, in every namespace, and the garbage collector
            # then deletes what they owned (an operator's deployments among them).
            raise BadInput(
                "a DELETE of a CustomResourceDefinition deletes every object of its kind and "
                "what they own; ctrlrun decides deletes one object at a time"
            )
        case ["apis", *_, "scale"] if method in ("PATCH", "PUT") and segments[1:3] != [
            "apps",
            "v1",
        ]:
            # A custom resource's scale sets the replicas its operator gives a workload.
            raise BadInput(
                f"a {method} of {shown('/'.join(segments[-3:-1]), 80)}'s /scale through "
                f"{'/'.join(segments[1:3])} sets replicas ctrlrun decides only for apps/v1 "
                "Deployments, StatefulSets and ReplicaSets (k8s.scale)"
            )
        case _:
            return


def _ownable(segments: list[str]) -> bool:
    """A namespace (or its status, finalize) or a workload's status: paths where an owner may
    be written and no route decides the write."""
    match segments:
        case ["api", "v1", "namespaces", _] | ["api", "v1", "namespaces", _, "status" | "finalize"]:
            return True
        case ["apis", "apps", "v1", "namespaces", _, kind, _, "status"]:
            return kind in WORKLOADS
        case _:
            return False


def _metadata_only(request: Request) -> bool:
    """Whether the write changes nothing but the object's metadata (a label, an annotation).

    Read on its surface, strictly: any other key, a directive ($patch, $retainKeys) or a JSON
    patch operation writing outside /metadata is more than metadata. So is any server-side
    apply: it also removes the fields its manager applied before and leaves out now (an
    autoscaler's minReplicas, back to its default).
    """
    check_body(request)
    media, document = read_document(request)
    if media == "apply":
        return False
    if media == "json":
        return all(_writes_within(op, "metadata") for op in document)
    return set(document) <= {"apiVersion", "kind", "metadata"}


def _owned(request: Request) -> bool:
    """Whether the write may set the object's ``metadata.ownerReferences``."""
    check_body(request)
    media, document = read_document(request)
    if media == "json":
        return any(_may_write_owners(op) for op in document)
    meta = document.get("metadata")
    if meta is None:
        return False
    # Any case: older apiservers read JSON field names without it.
    return not isinstance(meta, dict) or any("ownerreferences" in k.casefold() for k in meta)


def _may_write_owners(op: Any) -> bool:
    """Whether a JSON patch operation may write ``/metadata/ownerReferences`` (or all of
    ``/metadata``, or the whole object), in any case."""
    if not isinstance(op, dict) or not isinstance(op.get("path"), str):
        return True
    if op.get("op") in ("test", "remove"):
        return False  # reading, or dropping: no owner is added
    tokens = [token.casefold() for token in op["path"].split("/")[1:3]]
    return tokens == ["metadata", "ownerreferences"][: len(tokens)]


def _writes_within(op: Any, *prefix: str) -> bool:
    """Whether a JSON patch operation writes only under ``/prefix/...`` (a test reads)."""
    if not isinstance(op, dict):
        return False
    if op.get("op") == "test":
        return True
    paths = [op.get("path"), op.get("from")] if op.get("op") == "move" else [op.get("path")]
    return all(
        isinstance(path, str) and path.split("/")[1 : len(prefix) + 1] == list(prefix)
        for path in paths
    )
