"""A fake Kubernetes apiserver on loopback: namespaces, deployments and their scale.

Enough of the API for ``kubectl scale|get|delete`` and the official Python client: legacy
discovery, ``/version``, JSON objects or server-side Tables, merge / strategic-merge / JSON
patches, ``resourceVersion`` preconditions, watches (polled), pods that accept ``exec``,
``attach`` and ``portforward`` upgrades (``pods.py``) and ``Status`` errors. Any bearer
token is accepted and none is kept.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from ..messages import Request, Response
from ..server import FakeServer
from .api import KubeApi
from .errors import ApiError
from .objects import Obj, converge, status
from .pods import Session
from .routes import dry_run_of
from .state import KubeState

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
        self._api = KubeApi(self._state, self._lock)

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

    def hold_rollout(self, namespace: str = "default", name: str = "checkout") -> None:
        """Leave the deployment's replicas not yet updated (a rollout in progress, which
        ``kubectl rollout status`` waits on) until ``finish_rollout``."""
        with self._lock:
            obj = _found(lambda: self._state.deployment(namespace, name))
            obj["status"]["updatedReplicas"] = 0
            obj["metadata"]["resourceVersion"] = str(self._state.next_rv())

    def finish_rollout(self, namespace: str = "default", name: str = "checkout") -> None:
        """What the deployment controller does at the end of a rollout: status catches up."""
        with self._lock:
            obj = converge(_found(lambda: self._state.deployment(namespace, name)))
            obj["metadata"]["resourceVersion"] = str(self._state.next_rv())

    def add_pod(
        self,
        namespace: str = "default",
        name: str = "web-0",
        *,
        containers: tuple[str, ...] = ("app",),
    ) -> Obj:
        """Seed a running pod (its namespace must exist) that exec, attach and portforward reach."""
        with self._lock:
            self._state.namespace(namespace)
            at, rv = self._state.clock(), self._state.next_rv()
            return copy.deepcopy(self._api.pods.add(namespace, name, containers, rv, at))

    @property
    def sessions(self) -> list[Session]:
        """Every exec, attach and portforward connection the fake accepted, in order."""
        with self._lock:
            return list(self._api.pods.sessions)

    @property
    def proxied(self) -> list[tuple[str, str]]:
        """Every request that reached an application through a pod's or a service's proxy."""
        with self._lock:
            return list(self._api.proxied)

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

    def persists_nothing(self, request: Request) -> bool:
        return dry_run_of(request)

    def handle(self, request: Request) -> Response:
        try:
            with self._lock:
                code, answer = self._api.dispatch(request)
        except ApiError as exc:
            return _status(exc.code, str(exc), exc.details, exc.reason)
        if isinstance(answer, Response):
            return answer
        if request.is_write and code < 300 and not dry_run_of(request):
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


def _found(get: Callable[[], Obj]) -> Obj:
    try:
        return get()
    except ApiError as exc:
        raise KeyError(str(exc)) from exc


def _status(
    code: int, message: str, details: Mapping[str, Any] | None = None, reason: str | None = None
) -> Response:
    return Response.json(code, status(code, message, details, reason))
