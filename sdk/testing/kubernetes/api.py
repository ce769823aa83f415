"""The apiserver's REST surface over one fake cluster: which handler answers each request."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from functools import partial
from typing import TypeAlias

from ..messages import Request, Response
from .errors import ApiError
from .objects import DISCOVERY, SERVER_VERSION, Obj, success, table
from .pods import Pods
from .routes import Call, check_dry_run, route
from .state import KubeState
from .watch import watch_events

Reply: TypeAlias = tuple[int, Obj | Response]
Handler: TypeAlias = Callable[[Call], Reply]
Source: TypeAlias = Callable[[], list[Obj]]
_PROXIES = ("pod_proxy", "service_proxy")


class KubeApi:
    """Answers apiserver requests from a :class:`KubeState`; ``dispatch`` runs under the lock."""

    def __init__(self, state: KubeState, lock: threading.RLock, pods: Pods | None = None) -> None:
        self._state = state
        self.pods = pods or Pods()
        self._lock = lock  # watches read the state later, from the stream
        st = state
        self._handlers: dict[tuple[str, str], Handler] = {
            ("GET", "namespaces"): lambda c: self._list(
                c, "Namespace", lambda: [*st.namespaces.values()]
            ),
            ("POST", "namespaces"): lambda c: (201, st.create_namespace(c.json(), c.dry_run)),
            ("GET", "namespace"): lambda c: self._one(c, "Namespace", st.namespace(c.name)),
            ("DELETE", "namespace"): lambda c: (
                200,
                st.delete_namespace(c.name, c.options(), c.dry_run),
            ),
            ("GET", "all_deployments"): lambda c: self._list(
                c, "Deployment", lambda: [*st.deployments.values()]
            ),
            ("GET", "deployments"): lambda c: self._list(
                c, "Deployment", partial(st.deployments_in, c.namespace)
            ),
            ("POST", "deployments"): lambda c: (
                201,
                st.create_deployment(c.namespace, c.json(), c.dry_run),
            ),
            ("GET", "deployment"): lambda c: self._one(
                c, "Deployment", st.deployment(c.namespace, c.name)
            ),
            ("PUT", "deployment"): lambda c: (
                200,
                st.update_deployment(st.deployment(c.namespace, c.name), c.json(), c.dry_run),
            ),
            ("PATCH", "deployment"): lambda c: (
                200,
                st.patch_deployment(
                    c.namespace, c.name, c.content_type, c.body, c.dry_run, c.field_manager
                ),
            ),
            ("DELETE", "deployment"): self._delete_deployment,
            ("GET", "scale"): lambda c: (200, st.scale(c.namespace, c.name)),
            ("PUT", "scale"): lambda c: (
                200,
                st.update_scale(c.namespace, c.name, c.json(), c.dry_run),
            ),
            ("PATCH", "scale"): lambda c: (
                200,
                st.patch_scale(c.namespace, c.name, c.content_type, c.body, c.dry_run),
            ),
        }
        self._add_pod_handlers()

    def _add_pod_handlers(self) -> None:
        """A pod's own paths: itself, its streams, and the proxies to its application."""
        self._handlers[("GET", "pod")] = lambda c: (200, self.pods.get(c.namespace, c.name))
        for method in ("PATCH", "PUT"):
            self._handlers[(method, "ephemeralcontainers")] = lambda c: (
                200,
                self.pods.add_ephemeral(c.namespace, c.name, c.request, c.dry_run),
            )
        self.proxied: list[tuple[str, str]] = []  # requests the applications received
        self._handlers.update(
            ((method, kind), self._proxied)
            for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
            for kind in _PROXIES
        )
        for kind in ("exec", "attach", "portforward"):
            for method in ("GET", "POST"):
                self._handlers[(method, kind)] = partial(self._connect, kind)

    def _proxied(self, call: Call) -> Reply:
        """What the application behind a pod's or a service's proxy answers: anything goes."""
        self.proxied.append((call.request.method, call.request.path))
        return 200, {"kind": "Proxied", "method": call.request.method, "path": call.request.path}

    def _connect(self, kind: str, call: Call) -> Reply:
        return 101, self.pods.connect(kind, call.namespace, call.name, call.request)

    def dispatch(self, request: Request) -> Reply:
        """Status and object (a private copy) or stream; ``ApiError`` for a refusal."""
        path = request.path.rstrip("/") or "/"
        if path == "/version" and request.method == "GET":
            return 200, dict(SERVER_VERSION)
        if path in DISCOVERY and request.method == "GET":
            return 200, copy.deepcopy(DISCOVERY[path])
        call = route(request)
        if call is None:
            raise ApiError(404, "the server could not find the requested resource")
        handler = self._handlers.get((request.method, call.kind))
        if handler is None:
            raise ApiError(405, "the server does not allow this method on the requested resource")
        if request.method in ("POST", "PUT", "PATCH", "DELETE") and call.kind not in _PROXIES:
            check_dry_run(request)  # a proxy passes the query on to the application unread
        code, answer = handler(call)
        return code, answer if isinstance(answer, Response) else copy.deepcopy(answer)

    def _delete_deployment(self, call: Call) -> Reply:
        old = self._state.delete_deployment(call.namespace, call.name, call.options(), call.dry_run)
        return 200, success(call.name, "apps", "deployments", old["metadata"]["uid"])

    def _one(self, call: Call, kind: str, obj: Obj) -> Reply:
        if call.as_table:
            full = call.query.get("includeObject") == "Object"
            return 200, table(kind, [obj], self._state.rv, self._state.clock(), full)
        return 200, obj

    def _list(self, call: Call, kind: str, source: Source) -> Reply:
        if call.query.get("watch") in ("true", "1"):
            stream = watch_events(kind, call.query, partial(self._snapshot, call, source))
            return 200, Response(200, headers={"Content-Type": "application/json"}, stream=stream)
        selected = self._select(call, source)
        if call.as_table:
            full = call.query.get("includeObject") == "Object"
            return 200, table(kind, selected, self._state.rv, self._state.clock(), full)
        listed: Obj = {
            "kind": f"{kind}List",
            "apiVersion": "apps/v1" if kind == "Deployment" else "v1",
            "metadata": {"resourceVersion": str(self._state.rv)},
            "items": selected,
        }
        return 200, listed

    def _select(self, call: Call, source: Source) -> list[Obj]:
        labels, fields = call.query.get("labelSelector", ""), call.query.get("fieldSelector", "")
        return self._state.select(source(), labels, fields)

    def _snapshot(self, call: Call, source: Source) -> tuple[int, dict[str, Obj]]:
        with self._lock:
            self._state.prune()
            selected = self._select(call, source)
            return self._state.rv, {o["metadata"]["uid"]: copy.deepcopy(o) for o in selected}
