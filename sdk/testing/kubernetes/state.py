"""The fake cluster's state: namespaces and deployments, with resourceVersion and generation.

Operations take decoded request parts, return the stored object (a private copy when
``dry_run``) or raise :class:`ApiError`. The caller holds the lock; nothing here does I/O.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from .errors import DEPLOYMENTS, NAMESPACES, ApiError, conflict, details, not_found
from .objects import (
    IMMORTAL_NAMESPACES,
    Obj,
    converge,
    new_deployment,
    new_namespace,
    scale_of,
    timestamp,
)
from .patch import APPLY, apply_patch, media, parse_apply
from .selectors import selector_matches

STALE = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


class KubeState:
    """Namespaces and deployments of one fake cluster."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.rv = 100
        self.namespaces: dict[str, Obj] = {}
        self.deployments: dict[tuple[str, str], Obj] = {}
        self.finalize_after: float | None = None
        self.deleting: dict[str, float] = {}  # exact deletion times (timestamps are seconds)

    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    # -- namespaces --------------------------------------------------------------------------

    def add_namespace(self, name: str, labels: Mapping[str, str]) -> Obj:
        if name in self.namespaces:
            raise ApiError(
                409,
                f'namespaces "{name}" already exists',
                details(NAMESPACES, name),
                reason="AlreadyExists",
            )
        self.namespaces[name] = new_namespace(name, self.next_rv(), self.clock(), labels)
        return self.namespaces[name]

    def create_namespace(self, body: Any, dry_run: bool) -> Obj:
        meta = body.get("metadata") if isinstance(body, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            raise ApiError(422, "Namespace is invalid: metadata.name: Required value")
        labels = meta.get("labels") or {} if isinstance(meta, dict) else {}
        if dry_run:
            return new_namespace(name, self.rv, self.clock(), labels)
        return self.add_namespace(name, labels)

    def namespace(self, name: str) -> Obj:
        self.prune()
        found = self.namespaces.get(name)
        if found is None:
            raise not_found(NAMESPACES, name)
        return found

    def delete_namespace(self, name: str, options: Mapping[str, Any], dry_run: bool) -> Obj:
        ns = self.namespace(name)
        _preconditions(ns, options, NAMESPACES)
        if name in IMMORTAL_NAMESPACES:
            raise ApiError(
                403,
                f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                details(NAMESPACES, name),
            )
        if ns["metadata"].get("deletionTimestamp"):
            raise conflict(
                NAMESPACES,
                name,
                "The system is ensuring all content is removed "
                "from this namespace.  Upon completion, this namespace will "
                "automatically be purged by the system.",
            )
        target = copy.deepcopy(ns) if dry_run else ns
        target["metadata"]["deletionTimestamp"] = timestamp(self.clock())
        target["status"]["phase"] = "Terminating"
        if not dry_run:
            self.deleting[name] = self.clock()
            target["metadata"]["resourceVersion"] = str(self.next_rv())
        return target

    def finish_namespace_deletion(self, name: str) -> None:
        if self.namespaces.pop(name, None) is None:
            raise KeyError(f"no namespace {name!r}")
        self.deleting.pop(name, None)
        for key in [k for k in self.deployments if k[0] == name]:
            del self.deployments[key]
        self.next_rv()

    def prune(self) -> None:
        """Finish terminating namespaces whose (optional) finalization delay has passed."""
        if self.finalize_after is None:
            return
        now = self.clock()
        for name, since in list(self.deleting.items()):
            if since + self.finalize_after <= now:
                self.finish_namespace_deletion(name)

    # -- deployments -------------------------------------------------------------------------

    def add_deployment(
        self, namespace: str, name: str, replicas: int, image: str, labels: Mapping[str, str]
    ) -> Obj:
        if namespace not in self.namespaces:
            self.add_namespace(namespace, {})
        if (namespace, name) in self.deployments:
            raise ApiError(
                409,
                f'deployments.apps "{name}" already exists',
                details(DEPLOYMENTS, name),
                reason="AlreadyExists",
            )
        obj = new_deployment(namespace, name, replicas, image, self.next_rv(), self.clock(), labels)
        self.deployments[(namespace, name)] = obj
        return obj

    def deployment(self, namespace: str, name: str) -> Obj:
        self.prune()
        found = self.deployments.get((namespace, name))
        if found is None:
            raise not_found(DEPLOYMENTS, name)
        return found

    def deployments_in(self, namespace: str) -> list[Obj]:
        return [d for (ns, _), d in self.deployments.items() if ns == namespace]

    def create_deployment(self, namespace: str, body: Any, dry_run: bool) -> Obj:
        if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
            raise ApiError(400, "the body of the request must be a Deployment object")
        name = str(body["metadata"].get("name") or "")
        spec: Obj = body["spec"] if isinstance(body.get("spec"), dict) else {}
        replicas = spec.get("replicas", 1)
        if not name or not _valid_replicas(replicas):
            raise ApiError(
                422,
                f'Deployment.apps "{name}" is invalid: metadata.name or '
                f"spec.replicas: Invalid value",
            )
        if self.namespace(namespace)["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                f'deployments.apps "{name}" is forbidden: unable to create new '
                f"content in namespace {namespace} because it is being terminated",
            )
        if (namespace, name) in self.deployments:
            raise ApiError(
                409,
                f'deployments.apps "{name}" already exists',
                details(DEPLOYMENTS, name),
                reason="AlreadyExists",
            )
        labels = body["metadata"].get("labels") or {}
        obj = new_deployment(
            namespace, name, replicas, "nginx:1.27", self.rv + 1, self.clock(), labels
        )
        obj["spec"].update(copy.deepcopy(spec))
        if not dry_run:
            self.deployments[(namespace, name)] = obj
            self.next_rv()
        return converge(obj)

    def update_deployment(self, old: Obj, body: Any, dry_run: bool) -> Obj:
        """Store ``body`` over ``old``: keep identity, check the precondition, bump versions."""
        meta = old["metadata"]
        if not isinstance(body, dict) or not isinstance(body.get("metadata", {}), dict):
            raise ApiError(400, "the body of the request must be a Deployment object")
        new: Obj = body
        new_meta = new.setdefault("metadata", {})
        if new_meta.get("name", meta["name"]) != meta["name"]:
            raise ApiError(
                400,
                f"the name of the object ({new_meta['name']}) does not match "
                f"the name on the URL ({meta['name']})",
            )
        wanted_rv = new_meta.get("resourceVersion")
        if wanted_rv not in (None, "", meta["resourceVersion"]):
            raise conflict(DEPLOYMENTS, meta["name"], STALE)
        spec = new.get("spec")
        if isinstance(spec, dict) and not (
            isinstance(spec.get("selector"), dict) and isinstance(spec.get("template"), dict)
        ):
            raise ApiError(
                422,
                f'Deployment.apps "{meta["name"]}" is invalid: spec.selector, spec.template: '
                "Required value",
                details(DEPLOYMENTS, meta["name"]),
            )
        if not isinstance(spec, dict) or not _valid_replicas(spec.setdefault("replicas", 1)):
            bad = spec.get("replicas") if isinstance(spec, dict) else spec
            raise ApiError(
                422,
                f'Deployment.apps "{meta["name"]}" is invalid: spec.replicas: '
                f"Invalid value: {bad}: must be greater than or equal to 0",
                details(DEPLOYMENTS, meta["name"]),
            )
        keep = ("name", "namespace", "uid", "creationTimestamp", "generation", "resourceVersion")
        new_meta.update({k: meta[k] for k in keep})
        new["apiVersion"], new["kind"] = "apps/v1", "Deployment"
        if new["spec"] != old["spec"]:
            new_meta["generation"] = int(meta["generation"]) + 1
        new = converge(new)
        if new == old or dry_run:
            return new
        new_meta["resourceVersion"] = str(self.next_rv())
        self.deployments[(meta["namespace"], meta["name"])] = new
        return new

    def patch_deployment(
        self,
        namespace: str,
        name: str,
        content_type: str,
        body: bytes,
        dry_run: bool,
        field_manager: str | None = None,
    ) -> Obj:
        applying = media(content_type) == APPLY
        if applying and not field_manager:
            raise ApiError(422, "PatchOptions.meta.k8s.io is invalid: fieldManager: Required value")
        if applying and (namespace, name) not in self.deployments:
            # Server-side apply is an upsert: the document creates the object.
            document = parse_apply(body)
            if not isinstance(document, dict):
                raise ApiError(400, "the body of the request must be a Deployment object")
            return self.create_deployment(namespace, document, dry_run)
        old = self.deployment(namespace, name)
        return self.update_deployment(old, apply_patch(old, content_type, body), dry_run=dry_run)

    def delete_deployment(
        self, namespace: str, name: str, options: Mapping[str, Any], dry_run: bool
    ) -> Obj:
        old = self.deployment(namespace, name)
        _preconditions(old, options, DEPLOYMENTS)
        if not dry_run:
            del self.deployments[(namespace, name)]
            self.next_rv()
        return old

    def scale(self, namespace: str, name: str) -> Obj:
        return scale_of(self.deployment(namespace, name))

    def update_scale(self, namespace: str, name: str, scale: Any, dry_run: bool) -> Obj:
        old = self.deployment(namespace, name)
        if not isinstance(scale, dict) or not isinstance(scale.get("spec", {}), dict):
            raise ApiError(400, "the body of the request must be a Scale object")
        meta = scale.get("metadata") or {}
        if meta.get("name", name) != name:
            raise ApiError(
                400,
                f"the name of the object ({meta['name']}) does not match the "
                f"name on the URL ({name})",
            )
        new = copy.deepcopy(old)
        new["metadata"]["resourceVersion"] = meta.get("resourceVersion")
        # Go decodes a Scale without spec.replicas (or without spec) as a scale to 0.
        spec = scale.get("spec")
        new["spec"]["replicas"] = spec.get("replicas", 0) if isinstance(spec, dict) else 0
        return scale_of(self.update_deployment(old, new, dry_run=dry_run))

    def patch_scale(
        self, namespace: str, name: str, content_type: str, body: bytes, dry_run: bool
    ) -> Obj:
        current = self.scale(namespace, name)
        return self.update_scale(namespace, name, apply_patch(current, content_type, body), dry_run)

    def select(self, objs: list[Obj], labels: str, fields: str) -> list[Obj]:
        def keep(obj: Obj) -> bool:
            meta = obj["metadata"]
            field_map = {"metadata.name": meta["name"]}
            if "namespace" in meta:
                field_map["metadata.namespace"] = meta["namespace"]
            if obj.get("status", {}).get("phase"):
                field_map["status.phase"] = obj["status"]["phase"]
            return selector_matches(labels, meta.get("labels", {})) and selector_matches(
                fields, field_map
            )

        return [o for o in objs if keep(o)]


def _valid_replicas(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _preconditions(obj: Obj, options: Mapping[str, Any], kind: tuple[str, str]) -> None:
    pre = options.get("preconditions") or {}
    meta = obj["metadata"]
    for field in ("uid", "resourceVersion"):
        if pre.get(field) not in (None, meta[field]):
            raise conflict(
                kind,
                meta["name"],
                f"Precondition failed: {field} in precondition: "
                f"{pre[field]}, {field} in object meta: {meta[field]}",
            )
