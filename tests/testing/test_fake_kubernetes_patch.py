"""The fake apiserver's patches against kubectl's own merge (``kubectl patch --local``), and
its dryRun (query and DELETE body), resourceVersion preconditions and apply patches."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from ctrlrun.testing import FakeKubernetes
from ctrlrun.testing.kubernetes.errors import ApiError
from ctrlrun.testing.kubernetes.patch import JSON_PATCH, MERGE, STRATEGIC, apply_patch

KUBECTL = shutil.which("kubectl")
DEPLOYMENT: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "web", "namespace": "default", "finalizers": ["a"]},
    "spec": {
        "replicas": 3,
        "selector": {"matchLabels": {"app": "web"}},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%"}},
        "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {
                "containers": [
                    {
                        "name": "web",
                        "image": "nginx:1.27",
                        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                        "ports": [{"containerPort": 80}, {"containerPort": 443}],
                    },
                    {"name": "side", "image": "busybox"},
                ]
            },
        },
    },
}
CONTAINERS = ("spec", "template", "spec", "containers")


def containers(*items: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"spec": {"template": {"spec": {"containers": list(items), **extra}}}}


STRATEGIC_PATCHES = {
    "replicas": {"spec": {"replicas": 5}},
    "delete_spec_beside_replicas": {"spec": {"replicas": 2, "$patch": "delete"}},
    "replace_spec": {"spec": {"$patch": "replace", "replicas": 2}},
    "set_image": containers({"name": "web", "image": "nginx:1.28"}),
    "add_container": containers({"name": "new", "image": "redis"}),
    "delete_container": containers({"name": "side", "$patch": "delete"}),
    "replace_containers": containers({"$patch": "replace"}, {"name": "only", "image": "x"}),
    "delete_env": containers({"name": "web", "env": [{"name": "A", "$patch": "delete"}]}),
    "merge_env": containers({"name": "web", "env": [{"name": "C", "value": "3"}]}),
    "ports_by_key": containers({"name": "web", "ports": [{"containerPort": 80, "name": "h"}]}),
    "retain_keys": {"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}},
    "element_order": containers(
        {"name": "web"}, **{"$setElementOrder/containers": [{"name": "side"}, {"name": "web"}]}
    ),
    "null_deletes": {"spec": {"strategy": None}},
    "finalizers_merge": {"metadata": {"finalizers": ["b"]}},
    "delete_from_primitive_list": {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}},
    "restart_annotation": {
        "spec": {"template": {"metadata": {"annotations": {"restartedAt": "2026-12-01"}}}}
    },
}
MERGE_PATCHES = {
    "replicas": {"spec": {"replicas": 5}},
    "containers_replaced": containers({"name": "web", "image": "nginx:1.28"}),
    "null_deletes": {"spec": {"strategy": None}},
}
JSON_PATCHES = {
    "replace_replicas": [{"op": "replace", "path": "/spec/replicas", "value": 7}],
    "test_then_replace": [
        {"op": "test", "path": "/spec/replicas", "value": 3},
        {"op": "replace", "path": "/spec/replicas", "value": 1},
    ],
    "image_by_index": [
        {"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "n:2"}
    ],
}


def kubectl_patch(tmp_path: Path, kind: str, patch: Any) -> dict[str, Any]:
    """What kubectl's own merge makes of ``patch`` on DEPLOYMENT (no server involved)."""
    assert KUBECTL is not None
    source = tmp_path / "deployment.json"
    source.write_text(json.dumps(DEPLOYMENT))
    args = ["patch", "--local", "-f", str(source), "--type", kind, "-p", json.dumps(patch)]
    done = subprocess.run(
        [KUBECTL, *args, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "none")},
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def comparable(value: Any) -> Any:
    """kubectl prints Go structs: empty maps, nulls, creationTimestamp and resources are noise."""
    if isinstance(value, dict):
        pruned = {
            k: comparable(v)
            for k, v in value.items()
            if k not in ("creationTimestamp", "resources", "status")
        }
        return {k: v for k, v in pruned.items() if v not in (None, {})}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")


@needs_kubectl
@pytest.mark.parametrize(
    ("kind", "media", "patch"),
    [("strategic", STRATEGIC, p) for p in STRATEGIC_PATCHES.values()]
    + [("merge", MERGE, p) for p in MERGE_PATCHES.values()]
    + [("json", JSON_PATCH, p) for p in JSON_PATCHES.values()],
    ids=[f"strategic-{n}" for n in STRATEGIC_PATCHES]
    + [f"merge-{n}" for n in MERGE_PATCHES]
    + [f"json-{n}" for n in JSON_PATCHES],
)
def test_the_fake_merges_as_kubectl_does(tmp_path: Path, kind: str, media: str, patch: Any) -> None:
    ours = apply_patch(DEPLOYMENT, media, json.dumps(patch).encode())
    assert comparable(ours) == comparable(kubectl_patch(tmp_path, kind, patch))


def test_a_unknown_directive_or_patch_value_is_refused() -> None:
    for patch in ({"spec": {"$foo": 1}}, {"spec": {"$patch": "explode"}}):
        with pytest.raises(ApiError) as info:
            apply_patch(DEPLOYMENT, STRATEGIC, json.dumps(patch).encode())
        assert info.value.code == 400


@pytest.fixture
def kube() -> Any:
    with FakeKubernetes() as fake:
        fake.add_deployment("default", "web", 3)
        yield fake


BASE = "/apis/apps/v1/namespaces/default/deployments/web"


def test_delete_spec_on_scale_scales_to_zero_and_on_the_deployment_is_invalid(
    kube: FakeKubernetes,
) -> None:
    directive = json.dumps({"spec": {"replicas": 2, "$patch": "delete"}})
    with httpx.Client(base_url=kube.url) as client:
        headers = {"Content-Type": STRATEGIC}
        whole = client.patch(BASE, content=directive, headers=headers)
        assert whole.status_code == 422  # a Deployment without selector and template
        scale = client.patch(BASE + "/scale?dryRun=All", content=directive, headers=headers)
        assert scale.status_code == 200 and scale.json()["spec"]["replicas"] == 0
    assert kube.replicas("default", "web") == 3 and kube.writes_applied == 0


def test_dry_run_in_a_delete_body_wins_over_the_query(kube: FakeKubernetes) -> None:
    with httpx.Client(base_url=kube.url) as client:
        dry = client.request("DELETE", BASE, json={"dryRun": ["All"]})
        assert dry.status_code == 200 and kube.deployments
        # The body's DeleteOptions are read and the query is not: this is a real delete.
        real = client.request("DELETE", BASE + "?dryRun=All", json={"propagationPolicy": "Orphan"})
        assert real.status_code == 200
    assert kube.deployments == {} and kube.writes_applied == 1


def test_resource_version_preconditions_on_every_write(kube: FakeKubernetes) -> None:
    rv = kube.deployment("default", "web")["metadata"]["resourceVersion"]
    stale = str(int(rv) - 1)
    with httpx.Client(base_url=kube.url) as client:
        for media, body in (
            (MERGE, {"metadata": {"resourceVersion": stale}, "spec": {"replicas": 4}}),
            (STRATEGIC, {"metadata": {"resourceVersion": stale}, "spec": {"replicas": 4}}),
            (JSON_PATCH, [{"op": "test", "path": "/metadata/resourceVersion", "value": stale}]),
        ):
            got = client.patch(BASE, content=json.dumps(body), headers={"Content-Type": media})
            assert got.status_code in (409, 422), (media, got.text)
        scale = {"metadata": {"name": "web", "resourceVersion": stale}, "spec": {"replicas": 4}}
        assert client.put(BASE + "/scale", json=scale).status_code == 409
        fresh = {"metadata": {"resourceVersion": rv}, "spec": {"replicas": 4}}
        ok = client.patch(BASE, content=json.dumps(fresh), headers={"Content-Type": MERGE})
        assert ok.status_code == 200 and ok.json()["metadata"]["resourceVersion"] != rv
    assert kube.replicas("default", "web") == 4 and kube.writes_applied == 1


def test_apply_patch_needs_a_field_manager_and_upserts(kube: FakeKubernetes) -> None:
    doc = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"replicas": 6},
    }
    headers = {"Content-Type": "application/apply-patch+yaml"}
    with httpx.Client(base_url=kube.url) as client:
        assert client.patch(BASE, content=json.dumps(doc), headers=headers).status_code == 422
        yaml_doc = (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  replicas: 6\n"
        )
        got = client.patch(BASE + "?fieldManager=me", content=yaml_doc, headers=headers)
        assert got.status_code == 200 and got.json()["spec"]["replicas"] == 6
        assert got.json()["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.27"
    assert kube.replicas("default", "web") == 6
