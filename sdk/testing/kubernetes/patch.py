"""Patch documents: JSON merge patch, strategic merge patch (its scalar subset), JSON patch."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from .errors import ApiError, parse_json

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
PATCH_TYPES = (JSON_PATCH, MERGE, STRATEGIC)


def apply_patch(target: Mapping[str, Any], content_type: str, body: bytes) -> dict[str, Any]:
    """The patched copy of ``target``; ``ApiError`` for a bad or failed patch."""
    media = content_type.split(";")[0].strip().lower()
    if media not in PATCH_TYPES:
        raise ApiError(
            415,
            f"the body of the request was in an unknown format - accepted media types include: "
            f"{', '.join(PATCH_TYPES)}",
        )
    patch = parse_json(body)
    if media == JSON_PATCH:
        if not isinstance(patch, list):
            raise ApiError(
                400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch"
            )
        return json_patch(target, patch)
    if not isinstance(patch, dict):
        raise ApiError(400, "the body of the request must be a JSON object")
    merged = merge_patch(target, patch)
    assert isinstance(merged, dict)
    return merged


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 (strategic merge is the same for the scalar fields the fake cares about)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue  # strategic-merge directives ($patch, $retainKeys): not modelled
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: Mapping[str, Any], ops: list[Any]) -> dict[str, Any]:
    """RFC 6902 ``add``, ``replace``, ``remove`` and ``test``; a failed op rejects all (422)."""
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
