"""Kubernetes workload writes, decided on what the apiserver would store::

    read      GET the object (not for /scale): what it is now, and its resourceVersion
    dry run   the write, re-encoded with a resourceVersion precondition, with dryRun=All:
              the object the apiserver would store, after its own merge and defaulting
    decide    replicas change -> k8s.scale on the stored count; any other change ->
              k8s.update_<kind> naming what changes; nothing changes -> the dry run's answer
    forward   (by the guard) the same document with the same precondition: the apiserver
              applies exactly what was decided, or answers 409 (nothing applied: failed)

The reads and the dry run carry the agent's own credentials and persist nothing. Anything
that prevents a decision refuses the write; an apiserver refusal of the read or the dry run
is the agent's answer (the write would be refused the same way).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from .config import Upstream
from .forward import Forwarded, Forwarder, forward_headers
from .refusals import Refusal
from .route_values import KubeWrite, Mapped, Request, check_arguments, shown

log = logging.getLogger(__name__)
_MAX_REPLICAS = 2**31 - 1  # spec.replicas is an int32
# Fields the apiserver sets on every write: not part of what a write changes.
_VOLATILE = ("resourceVersion", "generation", "managedFields", "creationTimestamp", "uid")
_RESTARTED = "kubectl.kubernetes.io/restartedAt"


@dataclass(frozen=True)
class Resolved:
    """The decided action and the request to forward (with its precondition)."""

    mapped: Mapped
    request: Request
    target: str


@dataclass(frozen=True)
class Answered:
    """The apiserver's own answer to the read or the dry run: nothing to forward."""

    reply: Forwarded
    outcome: str
    reason: str


async def resolve(
    forwarder: Forwarder,
    up: Upstream,
    request: Request,
    write: KubeWrite,
    target: str,
    headers: Sequence[tuple[str, str]],
) -> Resolved | Answered | Refusal:
    """Ask the apiserver what ``write`` would store, and decide which action that is."""
    asking = _asking(headers)
    old: dict[str, Any] | None = None
    version: str | None = None
    if not write.scale:
        got = await _send(forwarder, up, "GET", _object_path(write), asking, b"")
        if got.status == 404 and write.media == "apply":
            return _invalid(
                f"server-side apply would create {write.kind}/{write.name}; ctrlrun decides "
                "writes on an existing object: create it first"
            )
        early = _early(got, "read")
        if early is not None:
            return early
        old = _json_object(got.body)
        if old is None:
            return _refused("the apiserver's answer to the read is not a JSON object")
        version = _version(old)
        if version is None:
            return _refused("the object has no metadata.resourceVersion")
        if write.media == "apply" and not isinstance(write.document.get("metadata"), dict):
            return _invalid("an apply patch needs metadata")
    try:
        document = with_precondition(write.media, write.document, version)
    except ValueError as exc:
        return _invalid(str(exc))
    dry = await _send(forwarder, up, request.method, _dry_target(target), asking, _encode(document))
    early = _early(dry, "dry run")
    if early is not None:
        return early
    stored = _json_object(dry.body)
    if stored is None or _version(stored) is None:
        return _refused("the apiserver's answer to the dry run is not an object with a version")
    if version is None:  # /scale: the precondition is the version the dry run was made on
        version = _version(stored)
        document = with_precondition(write.media, write.document, version)
    decided = decide(write, old, stored)
    if decided is None:
        return Answered(dry, "unchanged", "the apiserver would change nothing: nothing sent")
    if isinstance(decided, Refusal):
        return decided
    return Resolved(decided, _with_body(request, _encode(document)), target)


def decide(
    write: KubeWrite, old: Mapping[str, Any] | None, stored: Mapping[str, Any]
) -> Mapped | Refusal | None:
    """The action for a write that turns ``old`` into ``stored`` (None: it changes nothing).

    Pure. On ``/scale`` (``old`` is None) it is always ``k8s.scale``.
    """
    replicas = _replicas(stored)
    if isinstance(replicas, Refusal):
        return replicas
    base = dict(write.arguments)
    if old is None:
        return Mapped("k8s.scale", {**base, "replicas": replicas})
    changes = changed(old, stored)
    if not changes:
        return None
    owners = _new_owners(old, stored)
    if owners:
        # The garbage collector deletes an object whose every owner is gone (not there, or
        # there under another uid), at once or once that owner is deleted: a delete by
        # another road, which an update's action would otherwise decide.
        return _invalid(
            f"this write gives {write.arguments.get('workload', write.name)} the owner "
            f"{shown(owners[0], 80)} (metadata.ownerReferences): the garbage collector "
            "deletes it once that owner is gone; ctrlrun decides deletes only by name"
        )
    if changes == ["replicas"]:
        return Mapped("k8s.scale", {**base, "replicas": replicas})
    if "replicas" in changes:
        others = ", ".join(c for c in changes if c != "replicas")
        return _invalid(
            f"this write changes replicas ({_replicas(old)} -> {replicas}) and {others} at "
            "once; ctrlrun decides one action per write: scale first (kubectl scale), then "
            "apply the rest"
        )
    arguments = {
        **base,
        "changes": changes,
        "images": images(stored),
        "replicas": replicas,
        "revision": revision(stored),
    }
    try:
        check_arguments(arguments)
    except Exception as exc:  # BadInput: a name with a control character
        return _invalid(getattr(exc, "reason", "unreadable object"))
    return Mapped(update_action(write), arguments)


def update_action(write: KubeWrite) -> str:
    """The action of an update of a workload of ``write``'s kind (``k8s.update_deployment``)."""
    return f"k8s.update_{write.arguments.get('workload', 'deployment/').split('/', 1)[0]}"


def changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What a write changes, by name: replicas, images, env, restart, template, spec,
    labels, annotations, metadata (sorted)."""
    found: set[str] = set()
    old_spec, new_spec = _map(old.get("spec")), _map(new.get("spec"))
    if old_spec.get("replicas") != new_spec.get("replicas"):
        found.add("replicas")
    old_pod, new_pod = _map(old_spec.get("template")), _map(new_spec.get("template"))
    if images(old) != images(new):
        found.add("images")
    if _envs(old_pod) != _envs(new_pod):
        found.add("env")
    old_notes = _map(_map(old_pod.get("metadata")).get("annotations"))
    new_notes = _map(_map(new_pod.get("metadata")).get("annotations"))
    if old_notes.get(_RESTARTED) != new_notes.get(_RESTARTED):
        found.add("restart")
    if _strip_pod(old_pod) != _strip_pod(new_pod):
        found.add("template")
    rest = ("replicas", "template")
    if {k: v for k, v in old_spec.items() if k not in rest} != {
        k: v for k, v in new_spec.items() if k not in rest
    }:
        found.add("spec")
    old_meta, new_meta = _meta(old), _meta(new)
    for part in ("labels", "annotations"):
        if old_meta.pop(part, None) != new_meta.pop(part, None):
            found.add(part)
    if old_meta != new_meta:
        found.add("metadata")
    return sorted(found)


def images(obj: Mapping[str, Any]) -> dict[str, str]:
    """Container name -> image, for the pod template's containers and init containers."""
    pod = _map(_map(_map(obj.get("spec")).get("template")).get("spec"))
    out: dict[str, str] = {}
    for field in ("initContainers", "containers"):
        for item in pod.get(field) or []:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                out[item["name"]] = str(item.get("image", ""))
    return out


def revision(obj: Mapping[str, Any]) -> str:
    """A short digest of what is stored (spec, labels, annotations): one per change."""
    meta = _map(obj.get("metadata"))
    doc = {"spec": obj.get("spec"), "labels": meta.get("labels"), "notes": meta.get("annotations")}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(text).hexdigest()[:16]


def with_precondition(media: str, document: Any, version: str | None) -> Any:
    """``document`` carrying "only if the object is still at ``version``" (None: as it is).

    A precondition the agent sent itself is kept: the dry run then answers for it.
    """
    if version is None:
        return document
    if media == "json":
        test = {"op": "test", "path": "/metadata/resourceVersion", "value": version}
        return [test, *document]
    out = dict(document)
    meta = out.get("metadata", {})
    if not isinstance(meta, dict):
        raise ValueError("the body's metadata must be an object")
    if meta.get("$patch") is not None:
        raise ValueError("a $patch directive on metadata would drop the precondition")
    if "resourceVersion" not in meta or meta["resourceVersion"] in (None, ""):
        out["metadata"] = {**meta, "resourceVersion": version}
    return out


def _new_owners(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The owner references ``new`` holds that ``old`` did not, as kind/name."""
    before = _map(old.get("metadata")).get("ownerReferences") or []
    after = _map(new.get("metadata")).get("ownerReferences") or []
    if not isinstance(after, list):
        return ["(unreadable)"]
    return [
        f"{_map(ref).get('kind')}/{_map(ref).get('name')}"
        for ref in after
        if not isinstance(before, list) or ref not in before
    ]


def _replicas(obj: Mapping[str, Any]) -> int | Refusal:
    value = _map(obj.get("spec")).get("replicas", 0)  # a Scale without replicas is 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_REPLICAS:
        return _refused(f"the dry run stores replicas {value!r}, not a count")
    return value


def _envs(pod: Mapping[str, Any]) -> list[Any]:
    spec = _map(pod.get("spec"))
    return [
        (c.get("name"), c.get("env"), c.get("envFrom"))
        for field in ("initContainers", "containers")
        for c in spec.get(field) or []
        if isinstance(c, dict)
    ]


def _strip_pod(pod: Mapping[str, Any]) -> Any:
    """The pod template without what images, env and restart already name."""
    out = json.loads(json.dumps(pod))
    meta = _map(out.get("metadata"))
    notes = _map(meta.get("annotations"))
    notes.pop(_RESTARTED, None)
    if not notes:
        meta.pop("annotations", None)  # absent and emptied are the same
    for field in ("initContainers", "containers"):
        for c in _map(out.get("spec")).get(field) or []:
            if isinstance(c, dict):
                for key in ("image", "env", "envFrom"):
                    c.pop(key, None)
    return out


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in _map(obj.get("metadata")).items() if k not in _VOLATILE}


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


async def _send(
    forwarder: Forwarder,
    up: Upstream,
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
) -> Forwarded:
    """A read or a dry run: it persists nothing, so any failure is just "no answer"."""
    try:
        return await forwarder.send(up, method, target, headers, body)
    except Exception as exc:
        log.warning("asking the apiserver before a write failed: %s", type(exc).__name__)
        return Forwarded(None, error=f"proxy error: {type(exc).__name__}")


def _early(got: Forwarded, what: str) -> Answered | Refusal | None:
    if got.status is None or got.cut_short:
        # Nothing was written (a read, or a dry run): refusing is safe, and so is a retry.
        return Refusal(
            "unavailable",
            "kube_dry_run_failed",
            f"ctrlrun could not ask the apiserver what this write does ({what}: "
            f"{got.error or 'no answer'}); nothing was written",
        )
    if got.status >= 300:
        return Answered(got, "refused_by_remote", f"the apiserver refused the {what}")
    return None


def _asking(headers: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The agent's headers (its credentials), asking for JSON."""
    out = [
        (k, v)
        for k, v in forward_headers(headers)
        if k.lower() not in ("accept", "content-encoding")
    ]
    return [*out, ("Accept", "application/json")]


def _object_path(write: KubeWrite) -> str:
    ns, name = quote(write.namespace, safe=""), quote(write.name, safe="")
    return f"/apis/apps/v1/namespaces/{ns}/{write.kind}/{name}"


def _dry_target(target: str) -> str:
    return target + ("&" if "?" in target else "?") + "dryRun=All"


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _version(obj: Mapping[str, Any]) -> str | None:
    value = _map(obj.get("metadata")).get("resourceVersion")
    return value if isinstance(value, str) and value else None


def _encode(document: Any) -> bytes:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _with_body(request: Request, body: bytes) -> Request:
    return Request(
        request.method, request.path, request.query, request.headers, body, request.repeated
    )


def _invalid(reason: str) -> Refusal:
    return Refusal("invalid_request", reason, f"request refused: {reason}")


def _refused(reason: str) -> Refusal:
    return Refusal("unavailable", "kube_dry_run_failed", f"request refused: {reason}")
