"""Patch documents: JSON merge patch, strategic merge patch, JSON patch and apply patches.

Strategic merge follows apimachinery's ``strategicpatch`` for the fields the fake serves:
lists with a merge key (``containers`` by ``name``, ``ports`` by ``containerPort``, ...) are
merged element by element, other lists replaced; the directives ``$patch`` (``merge``,
``replace``, ``delete``, in a map or a list element), ``$retainKeys``,
``$setElementOrder/<list>`` and ``$deleteFromPrimitiveList/<list>`` are applied; any other
``$`` key is refused, as the apiserver refuses what it cannot decode.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

import yaml

from .errors import ApiError, parse_json

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
PATCH_TYPES = (JSON_PATCH, MERGE, STRATEGIC, APPLY)
# The merge key of each list the fake's objects hold (the patchMergeKey of the Go types).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "conditions": "type",
    "hostAliases": "ip",
}
PRIMITIVE_MERGE = frozenset({"finalizers"})  # lists of scalars with patchStrategy merge
_ORDER = "$setElementOrder/"
_DELETE_FROM = "$deleteFromPrimitiveList/"


def media(content_type: str) -> str:
    return content_type.split(";")[0].strip().lower()


def apply_patch(target: Mapping[str, Any], content_type: str, body: bytes) -> dict[str, Any]:
    """The patched copy of ``target``; ``ApiError`` for a bad or failed patch."""
    kind = media(content_type)
    if kind not in PATCH_TYPES:
        raise ApiError(
            415,
            f"the body of the request was in an unknown format - accepted media types include: "
            f"{', '.join(PATCH_TYPES)}",
        )
    patch = parse_apply(body) if kind == APPLY else parse_json(body)
    if kind == JSON_PATCH:
        if not isinstance(patch, list):
            raise ApiError(
                400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
            )
        return json_patch(target, patch)
    if not isinstance(patch, dict):
        raise ApiError(400, "the body of the request must be a JSON object")
    # An apply document is merged as a strategic patch onto the live object: the fake keeps
    # no field ownership, so it neither removes fields a manager dropped nor reports conflicts.
    merged = merge_patch(target, patch) if kind == MERGE else strategic_merge(dict(target), patch)
    if not isinstance(merged, dict):
        raise ApiError(422, "the patch deletes the whole object")
    return merged


def parse_apply(body: bytes) -> Any:
    """An apply patch: YAML (JSON is YAML too)."""
    try:
        return yaml.safe_load(body.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"error decoding YAML: {str(exc)[:80]}") from exc


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge, ``null`` deletes, anything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge(target: Any, patch: dict[str, Any]) -> Any:
    """Strategic merge of map ``patch`` onto ``target``; ``None`` means "delete this map"."""
    patch = dict(patch)
    directive = patch.pop("$patch", "merge")
    if directive == "delete":
        return None
    if directive == "replace":
        return _plain(patch)
    if directive != "merge":
        raise ApiError(400, f"Unknown patch type: {directive!r} in map")
    retain = patch.pop("$retainKeys", None)
    result: dict[str, Any] = copy.deepcopy(target) if isinstance(target, dict) else {}
    orders = {k[len(_ORDER) :]: patch.pop(k) for k in [k for k in patch if k.startswith(_ORDER)]}
    removals = [k for k in patch if k.startswith(_DELETE_FROM)]
    for key in removals:
        field, gone = key[len(_DELETE_FROM) :], patch.pop(key)
        if isinstance(result.get(field), list) and isinstance(gone, list):
            result[field] = [v for v in result[field] if v not in gone]
    for key, value in patch.items():
        if key.startswith("$"):
            raise ApiError(400, f"unknown strategic merge directive {key!r}")
        result = _merge_field(result, key, value)
    for field, order in orders.items():
        if isinstance(result.get(field), list) and isinstance(order, list):
            result[field] = _ordered(result[field], order, MERGE_KEYS.get(field))
    if retain is not None:
        if not isinstance(retain, list):
            raise ApiError(400, "$retainKeys must be a list of field names")
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_field(result: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    if value is None:
        result.pop(key, None)
    elif isinstance(value, dict):
        merged = strategic_merge(result.get(key), value)
        if merged is None:
            result.pop(key, None)
        else:
            result[key] = merged
    elif isinstance(value, list) and key in MERGE_KEYS:
        result[key] = _merge_list(result.get(key), value, MERGE_KEYS[key])
    elif isinstance(value, list) and key in PRIMITIVE_MERGE:
        current = result.get(key)
        old: list[Any] = current if isinstance(current, list) else []
        result[key] = [*value, *(v for v in old if v not in value)]  # the patch's first
    else:
        result[key] = copy.deepcopy(value)
    return result


def _merge_list(target: Any, patch: list[Any], key: str) -> list[Any]:
    """Merge a list of maps by ``key``: elements merge, ``$patch`` replaces or deletes.

    As apimachinery orders it without ``$setElementOrder``: the patch's elements first, in
    the patch's order, then the elements only the target has, in the target's order.
    """
    if any(isinstance(e, dict) and e.get("$patch") == "replace" and len(e) == 1 for e in patch):
        return [_plain(e) for e in patch if not (isinstance(e, dict) and "$patch" in e)]
    original = target if isinstance(target, list) else []
    first: list[Any] = []
    named = set()
    for element in patch:
        if not isinstance(element, dict) or key not in element:
            raise ApiError(400, f"a list element merged by {key!r} must be a map naming its {key}")
        named.add(json.dumps(element[key], sort_keys=True))
        old = next(
            (e for e in original if isinstance(e, dict) and e.get(key) == element[key]), None
        )
        if element.get("$patch") == "delete":
            continue
        first.append(_plain(element) if old is None else strategic_merge(old, element))
    rest = [
        copy.deepcopy(e)
        for e in original
        if not (isinstance(e, dict) and json.dumps(e.get(key), sort_keys=True) in named)
    ]
    return [*first, *rest]


def _ordered(items: list[Any], order: list[Any], key: str | None) -> list[Any]:
    """``items`` in the order ``$setElementOrder`` gives; items it does not name go last."""

    def ident(item: Any) -> Any:
        return item.get(key) if key and isinstance(item, dict) else item

    wanted = [ident(o) for o in order]
    rank = {json.dumps(w, sort_keys=True): i for i, w in enumerate(wanted)}
    return sorted(items, key=lambda i: rank.get(json.dumps(ident(i), sort_keys=True), len(rank)))


def _plain(value: Any) -> Any:
    """``value`` without directive keys (what a replaced or added element stores)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return copy.deepcopy(value)


def json_patch(target: Mapping[str, Any], ops: list[Any]) -> dict[str, Any]:
    """RFC 6902 ``add``, ``replace``, ``remove``, ``copy``, ``move`` and ``test``; a failed op
    rejects all (422)."""
    doc: dict[str, Any] = copy.deepcopy(dict(target))
    for op in ops:
        if not isinstance(op, dict) or not isinstance(op.get("path"), str):
            raise ApiError(400, f"invalid JSON patch operation: {op!r}")
        kind, path = op.get("op"), op["path"]
        parent, key = _locate(doc, path)
        if kind == "test":
            if _get(parent, key, path) != op.get("value"):
                raise ApiError(422, f"testing value {path} failed: test failed")
        elif kind in ("add", "replace"):
            if "value" not in op:
                raise ApiError(400, f"missing value for {kind} of {path}")
            if kind == "replace":
                _get(parent, key, path)
            _set(parent, key, copy.deepcopy(op["value"]), insert=kind == "add")
        elif kind == "remove":
            _get(parent, key, path)
            del parent[int(key) if isinstance(parent, list) else key]
        elif kind in ("copy", "move"):
            source = op.get("from")
            if not isinstance(source, str):
                raise ApiError(400, f"missing from for {kind} of {path}")
            origin, name = _locate(doc, source)
            value = copy.deepcopy(_get(origin, name, source))
            if kind == "move":  # RFC 6902: a remove of "from", then an add at "path"
                del origin[int(name) if isinstance(origin, list) else name]
                parent, key = _locate(doc, path)
            _set(parent, key, value, insert=True)
        else:
            raise ApiError(422, f"unsupported JSON patch operation {kind!r} (fake apiserver)")
    return doc


def _locate(doc: dict[str, Any], path: str) -> tuple[Any, str]:
    if not path.startswith("/"):
        raise ApiError(422, f"JSON pointer must start with '/': {path!r}")
    tokens = [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]
    node: Any = doc
    for token in tokens[:-1]:
        node = _get(node, token, path)
    return node, tokens[-1]


def _get(node: Any, key: str, path: str) -> Any:
    try:
        return node[int(key)] if isinstance(node, list) else node[key]
    except (KeyError, IndexError, ValueError, TypeError) as exc:
        raise ApiError(422, f"the path {path!r} does not exist in the object") from exc


def _set(node: Any, key: str, value: Any, *, insert: bool) -> None:
    if isinstance(node, list):
        index = len(node) if key == "-" else int(key)
        if insert:
            node.insert(index, value)
        else:
            node[index] = value
    elif isinstance(node, dict):
        node[key] = value
    else:
        raise ApiError(422, f"cannot set {key!r} on a scalar")
