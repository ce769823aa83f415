"""``kubectl scale`` through ``ctrlrun proxy`` (a subprocess) and its reverse listener:
recorded once, refused after."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from harness import KUBE_TOKEN, POLICY, Sidecar, clean_env, running_sidecar

from ctrlrun.testing import FakeKubernetes, FakeStripe

KUBECTL = shutil.which("kubectl")
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed"),
]
KEY = "scale:prod-eu:checkout:6"
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: prod-eu
  cluster:
    server: {server}
users:
- name: agent
  user:
    token: {token}
contexts:
- name: prod-eu
  context:
    cluster: prod-eu
    user: agent
    namespace: default
current-context: prod-eu
"""


def kubectl(home: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run kubectl with its own HOME and KUBECONFIG; returns the result and the elapsed time."""
    assert KUBECTL is not None
    env = clean_env(HOME=str(home), KUBECONFIG=str(home / "kubeconfig"))
    started = time.monotonic()
    done = subprocess.run(
        [KUBECTL, *args, "--request-timeout=20s"],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
    )
    return done, time.monotonic() - started


def test_kubectl_scale_is_recorded_and_a_second_one_refused_promptly(
    sidecar_command: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], tmp_path: Path
) -> None:
    sidecar = sidecar_command  # the real command: the product as kubectl's user runs it
    _, kube = fakes
    home = tmp_path / "home"
    home.mkdir()
    (home / "kubeconfig").write_text(KUBECONFIG.format(server=sidecar.kube_base, token=KUBE_TOKEN))

    first, _ = kubectl(home, "scale", "deployment/checkout", "--replicas=6")
    assert first.returncode == 0, first.stderr
    assert "scaled" in first.stdout
    assert kube.replicas("default", "checkout") == 6

    effects = sidecar.cli("effects", "--json", "--store-url", sidecar.store_url)
    records = [json.loads(line) for line in effects.stdout.splitlines()]
    assert [(r["effect_key"], r["action"], r["state"]) for r in records] == [
        (KEY, "k8s.scale", "committed")
    ]
    receipts = sidecar.cli("receipts", "--store-url", sidecar.store_url).stdout
    assert "k8s.scale  allow/committed  " + KEY in receipts

    # ctrlrun answers 403, not 409: kubectl scale would retry a conflict for five minutes.
    second, elapsed = kubectl(home, "scale", "deployment/checkout", "--replicas=6")
    assert second.returncode != 0
    assert elapsed < 20
    assert "ctrlrun:" in second.stderr
    assert kube.count("PATCH") == 1
    assert kube.writes_applied == 1
    receipts = sidecar.cli("receipts", "--store-url", sidecar.store_url).stdout
    assert "allow/blocked  " + KEY in receipts


APPROVE_SCALES = POLICY.replace(
    '    effect: "scale:{{cluster}}:{{deployment}}:{{replicas}}"\n    decision: allow\n',
    '    effect: "scale:{{cluster}}:{{namespace}}:{{deployment}}:{{replicas}}"\n'
    "    decision: approve\n",
)


def asked(done: subprocess.CompletedProcess[str]) -> str:
    """The approval request id a refused kubectl command printed."""
    assert done.returncode != 0
    found = re.search(r"ctrlrun approve (apr_[0-9a-f]{32})", done.stderr)
    assert found, done.stderr
    assert "re-send the identical request" in done.stderr
    return found.group(1)


def test_kubectl_rerun_after_approve_succeeds_once_and_a_changed_command_asks_again(
    fakes: tuple[FakeStripe, FakeKubernetes], tmp_path: Path
) -> None:
    _, kube = fakes
    assert "decision: approve" in APPROVE_SCALES
    with running_sidecar(
        tmp_path / "sc", *fakes, policy_text=APPROVE_SCALES, in_process=True
    ) as sidecar:
        home = tmp_path / "home"
        home.mkdir()
        config = KUBECONFIG.format(server=sidecar.kube_base, token=KUBE_TOKEN)
        (home / "kubeconfig").write_text(config)
        scale = ("scale", "deployment/checkout")

        request_id = asked(kubectl(home, *scale, "--replicas=6")[0])
        granted = sidecar.cli("approve", request_id, "--store-url", sidecar.store_url)
        assert granted.returncode == 0, granted.stderr

        changed = asked(kubectl(home, *scale, "--replicas=7")[0])  # a new request
        assert changed != request_id
        assert kube.replicas("default", "checkout") == 3

        again, _ = kubectl(home, *scale, "--replicas=6")  # the identical command: no header
        assert again.returncode == 0, again.stderr
        assert kube.replicas("default", "checkout") == 6

        # Once: the same command again asks anew, and nothing more is written.
        assert asked(kubectl(home, *scale, "--replicas=6")[0]) not in (request_id, changed)
        assert kube.writes_applied == 1
        receipts = sidecar.cli("receipts", "--store-url", sidecar.store_url).stdout
        assert "k8s.scale  approve/committed  scale:prod-eu:default:checkout:6" in receipts
