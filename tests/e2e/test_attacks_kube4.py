"""Kubernetes writes that reach what ctrlrun decides by another road, through a real sidecar
to the fake apiserver: the garbage collector (an owner that is not there), a controller (an
autoscaler's minimum), the kubelet (a pod's image), an API group older than apps/v1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness import KUBE_TOKEN, Sidecar, start_sidecar
from test_kubectl import KUBECONFIG, kubectl
from test_kubectl_writes import STARTER_WITH_FAKES

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(180)
GHOST = {"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "0" * 8 + "-dead"}


def kubectl_home(sidecar: Sidecar, tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    config = KUBECONFIG.format(server=sidecar.kube_base, token=KUBE_TOKEN)
    (home / "kubeconfig").write_text(config)
    return home


def test_an_owner_that_is_not_there_is_refused_as_the_delete_it_is(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    # The garbage collector deletes an object whose every owner is gone (absent, or another
    # uid): an update adding such an owner is a delete of the deployment, which the starter
    # policy denies, by way of k8s.update_deployment, which it allows.
    kube = fakes[1]
    sidecar = start_sidecar(
        tmp_path / "sc", *fakes, policy_text=STARTER_WITH_FAKES, in_process=True
    )
    try:
        home = kubectl_home(sidecar, tmp_path)
        patch = json.dumps({"metadata": {"ownerReferences": [GHOST]}})
        done, _ = kubectl(home, "patch", "deployment/checkout", "--type=merge", "-p", patch)
        assert done.returncode != 0, done.stdout
        assert "ownerReferences" in done.stderr, done.stderr
        assert "ownerReferences" not in kube.deployment("default", "checkout")["metadata"]
        # A label is still an update, decided and applied.
        done, _ = kubectl(home, "label", "deployment/checkout", "team=pay")
        assert done.returncode == 0, done.stderr
        assert kube.deployment("default", "checkout")["metadata"]["labels"]["team"] == "pay"
    finally:
        sidecar.stop()
