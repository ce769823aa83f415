"""A fake Kubernetes apiserver on loopback: namespaces, deployments and their scale.

Enough of the API for ``kubectl scale|get|delete`` and the official Python client: legacy
discovery, ``/version``, JSON objects or server-side Tables, merge / strategic-merge / JSON
patches, ``resourceVersion`` preconditions, watches (polled) and ``Status`` errors. Any bearer
token is accepted and none is kept.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from functools import partial
from typing import Any

from ..messages import Request, Response
from ..server import FakeServer
from .objects import DISCOVERY, SERVER_VERSION, Obj, status, success, table
from .patch import ApiError, parse_json
from .state import KubeState

WATCH_POLL_SECONDS = 0.05
MAX_WATCH_SECONDS = 600
_NAME = "([^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str]]] = [
    (kind, re.compile(rx))
    for kind, rx in [
        ("namespaces", r"/api/v1/namespaces"),
        ("namespace", rf"/api/v1/namespaces/{_NAME}"),
        ("all_deployments", r"/apis/apps/v1/deployments"),
        ("deployments", rf"/apis/apps/v1/namespaces/{_NAME}/deployments"),
        ("deployment", rf"/apis/apps/v1/namespaces/{_NAME}/deployments/{_NAME}"),
        ("scale", rf"/apis/apps/v1/namespaces/{_NAME}/deployments/{_NAME}/scale"),
    ]
]
_INJECTED = {
    404: "the server could not find the requested resource",
    409: "Operation cannot be fulfilled: the object has been modified; please apply your "
    "changes to the latest version and try again",
    429: "Too many requests, please try again later.",
    500: "Internal error occurred: injected failure",
    503: "the server is currently unable to handle the request",
    504: "Timeout: request did not complete within the allotted time",
}


class FakeKubernetes(FakeServer):
    """A fake apiserver; see the module docstring and :class:`FakeServer`."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        tls: bool = False,
        hang_seconds: float = 30.0,
        clock: Callable[[], float] = time.time,
        finalize_namespaces_after: float | None = None,
    ) -> None:
        super().__init__(host, port, tls=tls, hang_seconds=hang_seconds)
        self._state = KubeState(clock)
        self._state.finalize_after = finalize_namespaces_after
        self._state.add_namespace("default", {})

    # -- seeding and inspection (any thread) -------------------------------------------------

    def add_namespace(self, name: str, *, labels: Mapping[str, str] | None = None) -> Obj:
        with self._lock:
            return copy.deepcopy(self._state.add_namespace(name, labels or {}))

    def add_deployment(
        self,
        namespace: str = "default",
        name: str = "checkout",
        replicas: int = 3,
        *,
        image: str = "nginx:1.27",
        labels: Mapping[str, str] | None = None,
    ) -> Obj:
        """Seed a deployment (creating its namespace when missing)."""
        with self._lock:
            obj = self._state.add_deployment(namespace, name, replicas, image, labels or {})
            return copy.deepcopy(obj)

    def deployment(self, namespace: str, name: str) -> Obj:
        """A copy of the deployment; ``KeyError`` when there is none."""
        with self._lock:
            return copy.deepcopy(_found(lambda: self._state.deployment(namespace, name)))

    def replicas(self, namespace: str, name: str) -> int:
        return int(self.deployment(namespace, name)["spec"]["replicas"])

    @property
    def deployments(self) -> dict[tuple[str, str], Obj]:
        with self._lock:
            self._state.prune()
            return copy.deepcopy(self._state.deployments)

    def set_replicas(self, namespace: str, name: str, replicas: int) -> Obj:
        """Change replicas as another actor would (an HPA, a human); not a counted write."""
        with self._lock:
            old = _found(lambda: self._state.deployment(namespace, name))
            new = copy.deepcopy(old)
            new["spec"]["replicas"] = replicas
            return copy.deepcopy(self._state.update_deployment(old, new, dry_run=False))

    def namespace(self, name: str) -> Obj:
        """A copy of the namespace; ``KeyError`` when there is none."""
        with self._lock:
            return copy.deepcopy(_found(lambda: self._state.namespace(name)))

    @property
    def namespaces(self) -> dict[str, Obj]:
        with self._lock:
            self._state.prune()
            return copy.deepcopy(self._state.namespaces)

    def finish_namespace_deletion(self, name: str) -> None:
        """What the namespace controller does at the end: the namespace (and content) is gone."""
        with self._lock:
            self._state.finish_namespace_deletion(name)

    # -- the HTTP side (server thread) ---------------------------------------------------------

    def handle(self, request: Request) -> Response:
        query = dict(request.query)
        dry_run = query.get("dryRun") == "All"
        try:
            with self._lock:
                code, answer = self._dispatch(request, query, dry_run)
        except ApiError as exc:
            return _status(exc.code, str(exc), exc.details, exc.reason)
        if isinstance(answer, Response):
            return answer
        if request.is_write and code < 300 and not dry_run:
            self._applied()
        return Response.json(code, answer)

    def error_response(
        self, request: Request, status: int, *, applied: Response | None
    ) -> Response:
        return _status(status, _INJECTED.get(status, f"injected failure ({status})"))

    def finalize(self, request: Request, response: Response) -> Response:
        response.headers.setdefault("Audit-Id", str(uuid.uuid4()))
        response.headers.setdefault("Cache-Control", "no-cache, private")
        return response

    def _dispatch(
        self, request: Request, query: dict[str, str], dry_run: bool
    ) -> tuple[int, Obj | Response]:
        path, method, st = request.path.rstrip("/") or "/", request.method, self._state
        if path == "/version" and method == "GET":
            return 200, dict(SERVER_VERSION)
        if path in DISCOVERY and method == "GET":
            return 200, copy.deepcopy(DISCOVERY[path])
        for kind, pattern in _ROUTES:
            match = pattern.fullmatch(path)
            if match is None:
                continue
            groups = [*match.groups(), "", ""]
            ns, name = groups[0], groups[1]
            if kind == "namespace":  # /api/v1/namespaces/{name}: the one group is the name
                ns, name = "", ns
            ctype, body = request.header("content-type"), request.body
            action = f"{method} {kind}"
            if action == "GET namespaces":
                return self._list(request, query, "Namespace", lambda: [*st.namespaces.values()])
            if action == "POST namespaces":
                created = st.create_namespace(parse_json(body), dry_run)
                return 201, copy.deepcopy(created)
            if action == "GET namespace":
                return 200, self._one(request, "Namespace", st.namespace(name))
            if action == "DELETE namespace":
                deleted = st.delete_namespace(name, _options(body), dry_run)
                return 200, copy.deepcopy(deleted)
            if action == "GET all_deployments":
                return self._list(request, query, "Deployment", lambda: [*st.deployments.values()])
            if action == "GET deployments":
                return self._list(request, query, "Deployment", partial(st.deployments_in, ns))
            if action == "POST deployments":
                return 201, copy.deepcopy(st.create_deployment(ns, parse_json(body), dry_run))
            if action == "GET deployment":
                return 200, self._one(request, "Deployment", st.deployment(ns, name))
            if action == "PUT deployment":
                old = st.deployment(ns, name)
                return 200, copy.deepcopy(st.update_deployment(old, parse_json(body), dry_run))
            if action == "PATCH deployment":
                return 200, copy.deepcopy(st.patch_deployment(ns, name, ctype, body, dry_run))
            if action == "DELETE deployment":
                old = st.delete_deployment(ns, name, _options(body), dry_run)
                return 200, success(name, "apps", "deployments", old["metadata"]["uid"])
            if action == "GET scale":
                return 200, st.scale(ns, name)
            if action == "PUT scale":
                return 200, st.update_scale(ns, name, parse_json(body), dry_run)
            if action == "PATCH scale":
                return 200, st.patch_scale(ns, name, ctype, body, dry_run)
            raise ApiError(405, "the server does not allow this method on the requested resource")
        raise ApiError(404, "the server could not find the requested resource")

    def _one(self, request: Request, kind: str, obj: Obj) -> Obj:
        if "as=Table" in request.header("accept"):
            full = dict(request.query).get("includeObject") == "Object"
            return table(kind, [obj], self._state.rv, self._state.clock(), full)
        return copy.deepcopy(obj)

    def _list(
        self, request: Request, query: dict[str, str], kind: str, source: Callable[[], list[Obj]]
    ) -> tuple[int, Obj | Response]:
        if query.get("watch") in ("true", "1"):
            stream = self._events(kind, query, source)
            return 200, Response(200, headers={"Content-Type": "application/json"}, stream=stream)
        labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
        selected = self._state.select(source(), labels, fields)
        if "as=Table" in request.header("accept"):
            full = query.get("includeObject") == "Object"
            return 200, table(kind, selected, self._state.rv, self._state.clock(), full)
        listed: Obj = {
            "kind": f"{kind}List",
            "apiVersion": "apps/v1" if kind == "Deployment" else "v1",
            "metadata": {"resourceVersion": str(self._state.rv)},
            "items": copy.deepcopy(selected),
        }
        return 200, listed

    async def _events(
        self, kind: str, query: dict[str, str], source: Callable[[], list[Obj]]
    ) -> AsyncIterator[bytes]:
        """Poll the state and turn differences into watch events, until the timeout."""
        rv_text = query.get("resourceVersion", "")
        since = int(rv_text) if rv_text.isdigit() and rv_text != "0" else None
        seen = self._snapshot(query, source)
        for obj in seen.values():
            if since is None or int(obj["metadata"]["resourceVersion"]) > since:
                yield _event("ADDED" if since is None else "MODIFIED", obj)
        if query.get("sendInitialEvents") == "true":
            end = {"k8s.io/initial-events-end": "true"}
            marker = {"resourceVersion": str(self._state.rv), "annotations": end}
            yield _event("BOOKMARK", {"kind": kind, "metadata": marker})
        timeout = min(int(query.get("timeoutSeconds") or 60), MAX_WATCH_SECONDS)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            await asyncio.sleep(WATCH_POLL_SECONDS)
            current = self._snapshot(query, source)
            for key, obj in current.items():
                old = seen.get(key)
                if old is None or _rv(old) != _rv(obj):
                    yield _event("ADDED" if old is None else "MODIFIED", obj)
            for key in seen.keys() - current.keys():
                gone = seen[key]
                gone["metadata"]["resourceVersion"] = str(self._state.rv)
                yield _event("DELETED", gone)
            seen = current

    def _snapshot(self, query: dict[str, str], source: Callable[[], list[Obj]]) -> dict[str, Obj]:
        with self._lock:
            self._state.prune()
            labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
            selected = self._state.select(source(), labels, fields)
            return {o["metadata"]["uid"]: copy.deepcopy(o) for o in selected}


def _found(get: Callable[[], Obj]) -> Obj:
    try:
        return get()
    except ApiError as exc:
        raise KeyError(str(exc)) from exc


def _options(body: bytes) -> dict[str, Any]:
    options = parse_json(body)
    return options if isinstance(options, dict) else {}


def _status(
    code: int, message: str, details: Mapping[str, Any] | None = None, reason: str | None = None
) -> Response:
    return Response.json(code, status(code, message, details, reason))


def _rv(obj: Obj) -> str:
    return str(obj["metadata"]["resourceVersion"])


def _event(kind: str, obj: Obj) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"
