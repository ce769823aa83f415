"""``ctrlrun proxy`` as an operator meets it: ``--check``, bad policies, SIGHUP, the admin port."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness import KUBE_TOKEN, Sidecar, clean_env, running_sidecar
from inprocess import cli
from prometheus_client.parser import text_string_to_metric_families

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(90)

SCALE = "/apis/apps/v1/namespaces/default/deployments/checkout/scale"
ALLOW_SCALE = '    effect: "scale:{cluster}:{deployment}:{replicas}"\n    decision: allow\n'
BAD_POLICIES = {
    "unknown_key": "schema: ctrlrun.policy/v2\nactions: {}\nbogus: 1\n",
    "unknown_schema": "schema: ctrlrun.policy/v9\nactions: {}\n",
    "not_yaml": "schema: ctrlrun.policy/v2\nactions: [\n",
    "float_operand": "schema: ctrlrun.policy/v2\nactions:\n  a.b:\n    rules:\n"
    "      - when: {amount_lte: 1.5}\n        decision: allow\n",
    "bad_decision": "schema: ctrlrun.policy/v2\nactions:\n  a.b:\n    decision: maybe\n",
    "bad_profile": "schema: ctrlrun.policy/v2\nactions: {}\nupstreams:\n  x:\n"
    "    profile: ftp\n    url: http://127.0.0.1:9\n",
}
GOOD_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  k8s.scale:
    effect: "scale:{cluster}:{deployment}:{replicas}"
    decision: allow
upstreams:
  cluster:
    profile: kubernetes
    url: http://127.0.0.1:9
    cluster: prod-eu
"""


def run_proxy(tmp_path: Path, policy: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``ctrlrun proxy`` as a process; with ``--check`` in this process (it only validates)."""
    argv = [
        "proxy",
        "--policy",
        str(policy),
        "--listen",
        "127.0.0.1:0",
        "--store-url",
        f"sqlite:///{tmp_path / 'state.db'}",
        "--confdir",
        str(tmp_path / "mitm"),
        *args,
    ]
    if "--check" in args:
        return cli(argv, clean_env())
    return subprocess.run(
        [sys.executable, "-m", "ctrlrun.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
        cwd=tmp_path,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of an expected error; no traceback."""
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("ctrlrun: ")
    return lines[0]


@pytest.mark.parametrize("name", sorted(BAD_POLICIES))
def test_check_refuses_a_bad_policy_with_one_line(tmp_path: Path, name: str) -> None:
    policy = tmp_path / f"{name}.yaml"
    policy.write_text(BAD_POLICIES[name])

    done = run_proxy(tmp_path, policy, "--check")

    assert done.returncode == 2
    assert re.match(rf"ctrlrun: {re.escape(str(policy))}:\d+: ", one_line(done))
    assert done.stdout == ""


@pytest.mark.parametrize("name", ["unknown_key", "not_yaml"])
def test_serving_a_bad_policy_exits_2_with_one_line(tmp_path: Path, name: str) -> None:
    policy = tmp_path / f"{name}.yaml"
    policy.write_text(BAD_POLICIES[name])

    done = run_proxy(tmp_path, policy)

    assert done.returncode == 2
    assert str(policy) in one_line(done)
    assert "listening" not in done.stdout


@pytest.mark.parametrize("principal", ["", "  "])
def test_an_empty_principal_is_refused_before_anything_listens(
    tmp_path: Path, principal: str
) -> None:
    policy = tmp_path / "ctrlrun.yaml"
    policy.write_text(GOOD_POLICY)
    done = run_proxy(tmp_path, policy, "--principal", principal, "--check")
    assert done.returncode == 2
    assert "Invalid value for '--principal': empty" in done.stderr


def test_check_accepts_a_good_policy(tmp_path: Path) -> None:
    policy = tmp_path / "ctrlrun.yaml"
    policy.write_text(GOOD_POLICY)

    done = run_proxy(tmp_path, policy, "--check")

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok: policy ")
    assert "1 upstreams" in done.stdout


def test_check_refuses_a_missing_policy_a_busy_port_and_an_unreachable_store(
    tmp_path: Path,
) -> None:
    missing = run_proxy(tmp_path, tmp_path / "nope.yaml", "--check")
    assert missing.returncode == 2
    assert "nope.yaml" in one_line(missing)

    policy = tmp_path / "ctrlrun.yaml"
    policy.write_text(GOOD_POLICY)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = run_proxy(tmp_path, policy, "--check", "--admin", f"127.0.0.1:{port}")
    assert taken.returncode == 2
    assert f"127.0.0.1:{port}" in one_line(taken)

    # Port 1 on loopback: the connection is refused at once.
    down = run_proxy(
        tmp_path,
        policy,
        "--check",
        "--store-url",
        "postgresql+psycopg://postgres@127.0.0.1:1/nothing",
    )
    assert down.returncode == 2
    assert "127.0.0.1" in one_line(down)


@pytest.fixture
def running(tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[Sidecar]:
    """``ctrlrun proxy`` as a subprocess: its signals are the point."""
    stripe, kube = fakes
    with running_sidecar(tmp_path, stripe, kube, admin=True) as sc:
        yield sc


@pytest.fixture
def admin_sidecar(tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[Sidecar]:
    """The proxy with its admin listener, in this process."""
    stripe, kube = fakes
    with running_sidecar(tmp_path, stripe, kube, admin=True, in_process=True) as sc:
        yield sc


def patch_scale(sc: Sidecar, replicas: int) -> httpx.Response:
    return httpx.patch(
        sc.kube_base + SCALE,
        content=f'{{"spec":{{"replicas":{replicas}}}}}',
        headers={
            "Content-Type": "application/merge-patch+json",
            "Authorization": f"Bearer {KUBE_TOKEN}",
        },
        timeout=30,
        trust_env=False,
    )


def wait_for_log(sc: Sidecar, text: str, count: int = 1, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sc.log.read_text().count(text) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {text!r} in the proxy log: {sc.log.read_text()[-2000:]}")


def test_sighup_keeps_the_old_policy_when_the_new_one_is_bad_and_applies_a_good_one(
    running: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    _, kube = fakes
    assert running.proc is not None
    good = running.policy.read_text()
    assert good.count(ALLOW_SCALE) == 1

    running.policy.write_text(good.replace("decision: allow", "decision: sometimes"))
    running.proc.send_signal(signal.SIGHUP)
    wait_for_log(running, "policy reload refused")

    ok = patch_scale(running, 6)  # the old policy (allow) is still in force
    assert ok.status_code == 200, ok.text
    assert kube.replicas("default", "checkout") == 6

    running.policy.write_text(good.replace(ALLOW_SCALE, ALLOW_SCALE.replace("allow", "deny")))
    running.proc.send_signal(signal.SIGHUP)
    wait_for_log(running, "policy reloaded from")

    denied = patch_scale(running, 7)
    assert denied.status_code == 403
    assert denied.headers["X-Ctrlrun-Outcome"] == "denied"
    assert denied.json()["message"].startswith("ctrlrun:")
    assert kube.replicas("default", "checkout") == 6
    assert kube.count("PATCH") == 1
    assert running.proc.poll() is None  # neither reload stopped the proxy


def decisions(admin_url: str) -> dict[tuple[str, str], float]:
    """``ctrlrun_decisions_total`` by (action, outcome), from a real scrape."""
    scraped = httpx.get(admin_url + "/metrics", timeout=10, trust_env=False)
    assert scraped.status_code == 200
    assert scraped.headers["content-type"].startswith("text/plain")
    found: dict[tuple[str, str], float] = {}
    families = {f.name: f for f in text_string_to_metric_families(scraped.text)}
    assert {"ctrlrun_decisions", "ctrlrun_effects", "ctrlrun_upstream_latency_seconds"} <= set(
        families
    )
    for sample in families["ctrlrun_decisions"].samples:
        if sample.name == "ctrlrun_decisions_total":
            found[(sample.labels["action"], sample.labels["outcome"])] = sample.value
    return found


def test_admin_health_readiness_and_metrics_that_move_with_traffic(
    admin_sidecar: Sidecar,
) -> None:
    running = admin_sidecar
    assert running.admin_url.startswith("http://127.0.0.1:")
    get = httpx.Client(base_url=running.admin_url, timeout=10, trust_env=False)
    with get:
        assert (get.get("/healthz").status_code, get.get("/healthz").text) == (200, "ok\n")
        assert get.get("/readyz").status_code == 200
        assert get.get("/nope").status_code == 404
        assert get.post("/healthz").status_code == 405
    assert decisions(running.admin_url).get(("k8s.scale", "committed"), 0) == 0

    assert patch_scale(running, 6).status_code == 200
    assert patch_scale(running, 6).status_code == 403

    after = decisions(running.admin_url)
    assert after[("k8s.scale", "committed")] == 1
    assert after[("k8s.scale", "duplicate")] == 1
