"""What a Kubernetes write names and carries: the apps/v1 workloads ctrlrun decides, and a
write's document (a PUT's object, or a patch of one of the apiserver's types), read strictly."""

from __future__ import annotations

from typing import Any

import yaml

from .route_values import BadInput, Request, load_json, media_type, shown

# The apps/v1 workloads that have replicas, and the argument that names each one.
WORKLOADS = {
    "deployments": "deployment",
    "statefulsets": "statefulset",
    "replicasets": "replicaset",
}
# The patch types the apiserver accepts for these objects, by the name kube_result uses.
PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/json-patch+json": "json",
    "application/apply-patch+yaml": "apply",
}


def read_document(request: Request) -> tuple[str, Any]:
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
