"""Kubernetes writes decided on what the apiserver stores: the pure decision, the
precondition, and, through the sidecar, each patch type and directive decided on the replica
count the fake apiserver applies, checked against kubectl's own merge where it has one."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import fake_remotes, running_sidecar

from ctrlrun.proxy.kube_result import changed, decide, with_precondition
from ctrlrun.proxy.refusals import Refusal
from ctrlrun.proxy.route_values import KubeWrite, Mapped
from ctrlrun.testing import FakeKubernetes

KUBECTL = shutil.which("kubectl")
ARGS = {"cluster": "eu", "namespace": "prod", "deployment": "web", "workload": "deployment/web"}
OLD: dict[str, Any] = {
    "metadata": {"name": "web", "resourceVersion": "7", "labels": {"app": "web"}},
    "spec": {
        "replicas": 3,
        "selector": {"matchLabels": {"app": "web"}},
        "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]},
        },
    },
}


def write(scale: bool = False) -> KubeWrite:
    return KubeWrite("deployments", "prod", "web", scale, "strategic", {}, dict(ARGS))


def edited(**paths: Any) -> dict[str, Any]:
    new = copy.deepcopy(OLD)
    for dotted, value in paths.items():
        node = new
        *parents, last = dotted.split("__")
        for part in parents:
            node = node[part] if not part.isdigit() else node[int(part)]
        node[last] = value
    new["metadata"]["resourceVersion"] = "8"  # volatile: never a change
    return new


@pytest.mark.parametrize(
    ("new", "expected"),
    [
        (edited(), []),
        (edited(spec__replicas=5), ["replicas"]),
        (edited(spec__template__spec__containers__0__image="nginx:1.28"), ["images"]),
        (
            edited(
                spec__template__metadata__annotations={"kubectl.kubernetes.io/restartedAt": "t"}
            ),
            ["restart"],
        ),
        (edited(spec__template__spec__containers__0__env=[{"name": "A"}]), ["env"]),
        (edited(spec__template__spec__hostNetwork=True), ["template"]),
        (edited(spec__strategy={"type": "Recreate"}), ["spec"]),
        (edited(metadata__labels={"app": "x"}), ["labels"]),
        (edited(metadata__annotations={"a": "b"}), ["annotations"]),
        (edited(metadata__finalizers=["f"]), ["metadata"]),
    ],
)
def test_what_a_write_changes(new: dict[str, Any], expected: list[str]) -> None:
    assert changed(OLD, new) == expected


def test_decide() -> None:
    assert decide(write(scale=True), None, {"spec": {}}) == Mapped(
        "k8s.scale",
        {**ARGS, "replicas": 0},  # a Scale without spec.replicas is 0
    )
    assert decide(write(), OLD, edited()) is None
    assert decide(write(), OLD, edited(spec__replicas=50)) == Mapped(
        "k8s.scale", {**ARGS, "replicas": 50}
    )
    update = decide(write(), OLD, edited(spec__template__spec__containers__0__image="n:2"))
    assert isinstance(update, Mapped) and update.action == "k8s.update_deployment"
    assert update.arguments["changes"] == ["images"]
    assert update.arguments["images"] == {"web": "n:2"} and update.arguments["replicas"] == 3
    both = decide(
        write(), OLD, edited(spec__replicas=9, spec__template__spec__containers__0__image="n:2")
    )
    assert isinstance(both, Refusal) and both.outcome == "invalid_request"
    for bad in ("3", 3.0, True, -1, 2**31):
        refused = decide(write(scale=True), None, {"spec": {"replicas": bad}})
        assert isinstance(refused, Refusal), bad


def test_the_precondition_is_added_unless_the_agent_sent_one() -> None:
    assert with_precondition("merge", {"spec": {}}, "7") == {
        "spec": {},
        "metadata": {"resourceVersion": "7"},
    }
    own = {"metadata": {"resourceVersion": "6"}}
    assert with_precondition("put", own, "7") == own
    ops = [{"op": "replace", "path": "/spec/replicas", "value": 1}]
    assert with_precondition("json", ops, "7")[0] == {
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": "7",
    }
    for bad in ({"metadata": None}, {"metadata": {"$patch": "delete"}}):
        with pytest.raises(ValueError):
            with_precondition("strategic", bad, "7")


# -- through the sidecar -----------------------------------------------------------------------

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  k8s.scale:
    effect: "scale:{{cluster}}:{{namespace}}:{{workload}}:{{replicas}}"
    rules:
      - when: {{replicas_lte: 5}}
        decision: allow
  k8s.update_deployment:
    effect: "update:{{cluster}}:{{namespace}}:{{workload}}:{{revision}}"
    decision: allow
upstreams:
  stripe:
    profile: stripe
    url: {stripe}
    listen: 127.0.0.1:{stripe_port}
  cluster:
    profile: kubernetes
    url: {kube}
    cluster: prod-eu
    listen: 127.0.0.1:{kube_port}
    timeout: {timeout}
    reconcile: {reconcile}
"""
DEPLOY = "/apis/apps/v1/namespaces/default/deployments/checkout"
SMP = "application/strategic-merge-patch+json"
CASES = [
    # (path, content type, body, kubectl --type or None, stored replicas)
    ("/scale", "application/merge-patch+json", {"spec": {"replicas": 4}}, None, 4),
    ("/scale", SMP, {"spec": {"replicas": 2, "$patch": "delete"}}, None, 0),
    ("", SMP, {"spec": {"replicas": 4}}, "strategic", 4),
    ("", SMP, {"spec": {"$retainKeys": ["replicas"], "replicas": 4}}, None, None),
    ("", "application/merge-patch+json", {"spec": {"replicas": 9}}, "merge", 9),
    (
        "",
        "application/json-patch+json",
        [{"op": "replace", "path": "/spec/replicas", "value": 5}],
        "json",
        5,
    ),
    (
        "",
        "application/apply-patch+yaml",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "checkout"},
            "spec": {"replicas": 2},
        },
        None,
        2,
    ),
]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[Any, FakeKubernetes]]:
    with (
        fake_remotes("checkout") as (stripe, kube),
        running_sidecar(tmp_path, stripe, kube, policy_text=POLICY, in_process=True) as sc,
    ):
        yield sc, kube


def kubectl_replicas(tmp_path: Path, live: dict[str, Any], kind: str, patch: Any) -> int:
    assert KUBECTL is not None
    source = tmp_path / "live.json"
    source.write_text(json.dumps(live))
    args = ["patch", "--local", "-f", str(source), "--type", kind, "-p", json.dumps(patch)]
    done = subprocess.run(
        [KUBECTL, *args, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "none")},
    )
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout)["spec"].get("replicas", 1))


@pytest.mark.parametrize(("path", "media", "body", "kubectl", "replicas"), CASES)
def test_each_patch_is_decided_on_the_count_the_apiserver_stores(
    rig: tuple[Any, FakeKubernetes],
    tmp_path: Path,
    path: str,
    media: str,
    body: Any,
    kubectl: str | None,
    replicas: int | None,
) -> None:
    sc, kube = rig
    live = kube.deployment("default", "checkout")
    if kubectl and KUBECTL:
        assert kubectl_replicas(tmp_path, live, kubectl, body) == replicas
    query = "?fieldManager=agent" if "apply" in media else ""
    with httpx.Client(base_url=sc.kube_base, timeout=30, trust_env=False) as client:
        got = client.patch(
            DEPLOY + path + query, content=json.dumps(body), headers={"Content-Type": media}
        )
    docs = [
        json.loads(line)
        for line in sc.cli("receipts", "--json", "--store-url", sc.store_url).stdout.splitlines()
    ]
    receipts = [d for d in docs if d.get("kind") == "receipt"]
    if replicas is None:  # $retainKeys drops selector and template: the apiserver refuses it
        assert got.status_code == 422 and "x-ctrlrun-outcome" not in got.headers
        assert receipts == [] and kube.replicas("default", "checkout") == 3
        return
    (doc,) = receipts
    assert doc["action"] == "k8s.scale" and doc["arguments"]["replicas"] == replicas
    allowed = replicas <= 5
    assert doc["result"] == ("committed" if allowed else "denied"), got.text
    assert kube.replicas("default", "checkout") == (replicas if allowed else 3)
    assert kube.writes_applied == (1 if allowed else 0)
