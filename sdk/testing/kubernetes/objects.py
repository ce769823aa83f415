"""Kubernetes object shapes for the fake apiserver: namespaces, deployments, scales, Status,
server-side tables and the discovery documents kubectl and the Python client read."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any

Obj = dict[str, Any]

SERVER_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.4",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-04-22T00:00:00Z",
    "goVersion": "go1.23.6",
    "compiler": "gc",
    "platform": "linux/amd64",
}
IMMORTAL_NAMESPACES = frozenset({"default", "kube-system", "kube-public"})
_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    408: "Timeout",
    409: "Conflict",
    410: "Gone",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def timestamp(at: float) -> str:
    return dt.datetime.fromtimestamp(int(at), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(
    code: int, message: str, details: Mapping[str, Any] | None = None, reason: str | None = None
) -> Obj:
    """A failure ``Status``, the body of every apiserver error."""
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, "Unknown" if code < 500 else "InternalError"),
        "code": code,
    }
    if details:
        body["details"] = dict(details)
    return body


def success(name: str, group: str, kind: str, uid: str) -> Obj:
    details = {"name": name, "group": group, "kind": kind, "uid": uid}
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    }


def new_namespace(name: str, rv: int, at: float, labels: Mapping[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid4()),
            "resourceVersion": str(rv),
            "creationTimestamp": timestamp(at),
            "labels": {"kubernetes.io/metadata.name": name, **labels},
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def new_deployment(
    namespace: str,
    name: str,
    replicas: int,
    image: str,
    rv: int,
    at: float,
    labels: Mapping[str, str],
) -> Obj:
    match = {"app": name}
    return converge(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "resourceVersion": str(rv),
                "generation": 1,
                "creationTimestamp": timestamp(at),
                "labels": {**match, **labels},
                "annotations": {"deployment.kubernetes.io/revision": "1"},
            },
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": match},
                "template": {
                    "metadata": {"labels": match},
                    "spec": {"containers": [{"name": name, "image": image}]},
                },
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"},
                },
                "revisionHistoryLimit": 10,
                "progressDeadlineSeconds": 600,
            },
        }
    )


def converge(deployment: Obj) -> Obj:
    """The fake's deployment controller: status catches up with spec at once."""
    replicas = deployment["spec"].get("replicas", 1)
    deployment["status"] = {
        "observedGeneration": deployment["metadata"]["generation"],
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": replicas,
        "availableReplicas": replicas,
        "conditions": [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}
        ],
    }
    if not replicas:
        for key in ("readyReplicas", "availableReplicas", "updatedReplicas"):
            deployment["status"].pop(key)
    return deployment


def scale_of(deployment: Obj) -> Obj:
    meta = deployment["metadata"]
    selector = ",".join(
        f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items()
    )
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
        },
        "spec": {"replicas": deployment["spec"]["replicas"]},
        "status": {"replicas": deployment["status"]["replicas"], "selector": selector},
    }


def age(created: str, now: float) -> str:
    seconds = max(0, int(now - dt.datetime.fromisoformat(created).timestamp()))
    for unit, size, limit in (("s", 1, 120), ("m", 60, 3 * 3600), ("h", 3600, 48 * 3600)):
        if seconds < limit:
            return f"{seconds // size}{unit}"
    return f"{seconds // 86400}d"


def table(kind: str, items: list[Obj], rv: int, now: float, full: bool) -> Obj:
    """The ``meta.k8s.io/v1`` Table kubectl asks for with ``Accept: ...;as=Table``."""
    name = {"name": "Name", "type": "string", "format": "name", "priority": 0}
    cols: list[tuple[str, str]] = [("Age", "string")]
    if kind == "Deployment":
        cols = [("Ready", "string"), ("Up-to-date", "integer"), ("Available", "integer"), *cols]
    else:
        cols = [("Status", "string"), *cols]
    rows = []
    for item in items:
        meta, st = item["metadata"], item.get("status", {})
        if kind == "Deployment":
            ready = f"{st.get('readyReplicas', 0)}/{item['spec']['replicas']}"
            cells = [ready, st.get("updatedReplicas", 0), st.get("availableReplicas", 0)]
        else:
            cells = [st.get("phase", "Active")]
        partial = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": meta,
        }
        rows.append(
            {
                "cells": [meta["name"], *cells, age(meta["creationTimestamp"], now)],
                "object": item if full else partial,
            }
        )
    columns = [name] + [{"name": n, "type": t, "format": "", "priority": 0} for n, t in cols]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": str(rv)},
        "columnDefinitions": columns,
        "rows": rows,
    }


def _resource(name: str, kind: str, namespaced: bool, verbs: str, **extra: Any) -> Obj:
    return {
        "name": name,
        "singularName": extra.pop("singular", ""),
        "namespaced": namespaced,
        "kind": kind,
        "verbs": verbs.split(),
        **extra,
    }


def _group(name: str) -> Obj:
    version = {"groupVersion": f"{name}/v1", "version": "v1"}
    return {"name": name, "versions": [version], "preferredVersion": version}


RW = "create delete deletecollection get list patch update watch"
DISCOVERY: dict[str, Obj] = {
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/apis": {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group("apps"), _group("autoscaling")],
    },
    "/apis/apps": {"kind": "APIGroup", "apiVersion": "v1", **_group("apps")},
    "/apis/autoscaling": {"kind": "APIGroup", "apiVersion": "v1", **_group("autoscaling")},
    "/api/v1": {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            _resource(
                "namespaces",
                "Namespace",
                False,
                "create delete get list patch update watch",
                singular="namespace",
                shortNames=["ns"],
            ),
            _resource("namespaces/status", "Namespace", False, "get patch update"),
            _resource("pods", "Pod", True, "get", singular="pod", shortNames=["po"]),
            _resource("pods/exec", "PodExecOptions", True, "create get"),
            _resource("pods/attach", "PodAttachOptions", True, "create get"),
            _resource("pods/portforward", "PodPortForwardOptions", True, "create get"),
        ],
    },
    "/apis/apps/v1": {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "apps/v1",
        "resources": [
            _resource(
                "deployments",
                "Deployment",
                True,
                RW,
                singular="deployment",
                shortNames=["deploy"],
                categories=["all"],
            ),
            _resource(
                "deployments/scale",
                "Scale",
                True,
                "get patch update",
                group="autoscaling",
                version="v1",
            ),
            _resource("deployments/status", "Deployment", True, "get patch update"),
        ],
    },
    "/apis/autoscaling/v1": {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": "autoscaling/v1",
        "resources": [],
    },
}
