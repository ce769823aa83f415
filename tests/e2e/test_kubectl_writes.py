"""kubectl apply, set image, rollout restart and scale through the sidecar with the starter
policy: each decided by the action of what the apiserver stores (its dry run), not refused as
an unmapped write."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import KUBE_TOKEN, POLICY, Sidecar, running_sidecar
from test_kubectl import KUBECONFIG, kubectl

from ctrlrun.starter import STARTER_POLICY
from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed"),
]
# The starter policy's actions, with the harness's upstreams (the fakes).
_ACTIONS = STARTER_POLICY.split("\nupstreams:", 1)[0]
STARTER_WITH_FAKES = (
    _ACTIONS.replace("{", "{{").replace("}", "}}")
    + "\nupstreams:"
    + POLICY.split("\nupstreams:", 1)[1]
)
MANIFEST = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "checkout", "namespace": "default"},
    "spec": {
        "replicas": 3,
        "selector": {"matchLabels": {"app": "checkout"}},
        "template": {
            "metadata": {"labels": {"app": "checkout"}},
            "spec": {"containers": [{"name": "checkout", "image": "nginx:1.27"}]},
        },
    },
}


@pytest.fixture
def setup(
    fakes: tuple[FakeStripe, FakeKubernetes], tmp_path: Path
) -> Iterator[tuple[Sidecar, FakeKubernetes, Path]]:
    with running_sidecar(
        tmp_path / "sc", *fakes, policy_text=STARTER_WITH_FAKES, in_process=True
    ) as sidecar:
        home = tmp_path / "home"
        home.mkdir()
        config = KUBECONFIG.format(server=sidecar.kube_base, token=KUBE_TOKEN)
        (home / "kubeconfig").write_text(config)
        yield sidecar, fakes[1], home


def receipts(sidecar: Sidecar) -> list[dict[str, Any]]:
    out = sidecar.cli("receipts", "--json", "--store-url", sidecar.store_url).stdout
    docs = [json.loads(line) for line in out.splitlines()]
    return [d for d in docs if d.get("kind") == "receipt"]


def last(sidecar: Sidecar) -> dict[str, Any]:
    return receipts(sidecar)[-1]


def apply(home: Path, manifest: dict[str, Any], *extra: str) -> Any:
    path = home / "checkout.json"
    path.write_text(json.dumps(manifest))
    return kubectl(home, "apply", "--validate=false", "-f", str(path), *extra)[0]


def test_set_image_rollout_restart_and_scale_are_each_decided(
    setup: tuple[Sidecar, FakeKubernetes, Path],
) -> None:
    sidecar, kube, home = setup

    done, _ = kubectl(home, "set", "image", "deployment/checkout", "checkout=nginx:1.28")
    assert done.returncode == 0, done.stderr
    image = kube.deployment("default", "checkout")["spec"]["template"]["spec"]["containers"]
    assert image[0]["image"] == "nginx:1.28"
    doc = last(sidecar)
    assert (doc["action"], doc["result"]) == ("k8s.update_deployment", "committed")
    assert doc["arguments"]["changes"] == ["images"]
    assert doc["arguments"]["images"] == {"checkout": "nginx:1.28"}
    assert doc["effect_key"].startswith("update:prod-eu:default:deployment/checkout:")

    done, _ = kubectl(home, "rollout", "restart", "deployment/checkout")
    assert done.returncode == 0, done.stderr
    doc = last(sidecar)
    assert (doc["action"], doc["arguments"]["changes"]) == ("k8s.update_deployment", ["restart"])

    done, _ = kubectl(home, "scale", "deployment/checkout", "--replicas=5")
    assert done.returncode == 0, done.stderr
    doc = last(sidecar)
    assert (doc["action"], doc["arguments"]["replicas"]) == ("k8s.scale", 5)
    assert doc["effect_key"] == "scale:prod-eu:default:deployment/checkout:5"
    assert kube.replicas("default", "checkout") == 5

    # Past the starter policy's replicas_lte: 20, whichever way the count is carried.
    done, _ = kubectl(home, "scale", "deployment/checkout", "--replicas=50")
    assert done.returncode != 0 and "ctrlrun:" in done.stderr
    patch = json.dumps({"spec": {"replicas": 50}})
    done, _ = kubectl(home, "patch", "deployment/checkout", "-p", patch)
    assert done.returncode != 0 and "ctrlrun:" in done.stderr
    assert kube.replicas("default", "checkout") == 5
    assert [d["action"] for d in receipts(sidecar)[-2:]] == ["k8s.scale", "k8s.scale"]
    assert [d["result"] for d in receipts(sidecar)[-2:]] == ["denied", "denied"]


def test_kubectl_apply_client_and_server_side(
    setup: tuple[Sidecar, FakeKubernetes, Path],
) -> None:
    sidecar, kube, home = setup
    changed = json.loads(json.dumps(MANIFEST))
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "nginx:1.29"

    done = apply(home, changed)
    assert done.returncode == 0, done.stderr
    doc = last(sidecar)
    assert doc["action"] == "k8s.update_deployment" and "images" in doc["arguments"]["changes"]

    changed["spec"]["replicas"] = 7
    done = apply(home, changed, "--server-side", "--force-conflicts")
    assert done.returncode == 0, done.stderr
    doc = last(sidecar)
    assert (doc["action"], doc["arguments"]["replicas"]) == ("k8s.scale", 7)
    assert kube.replicas("default", "checkout") == 7

    changed["spec"]["replicas"] = 30
    done = apply(home, changed, "--server-side", "--force-conflicts")
    assert done.returncode != 0 and "ctrlrun:" in done.stderr
    assert kube.replicas("default", "checkout") == 7
    assert last(sidecar)["result"] == "denied"
