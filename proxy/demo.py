"""``ctrlrun demo``: a real sidecar between an agent and fake Stripe and Kubernetes, offline.

It starts the fake remotes and ``ctrlrun proxy`` on loopback, plays an agent against them
(with httpx, as any HTTP client would), and says what happened with the remotes' own counts.
"""

from __future__ import annotations

import contextlib
import select
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from ctrlrun.config import sqlite_url
from ctrlrun.errors import CTRLRunError
from ctrlrun.testing import FakeKubernetes, FakeStripe

from . import demo_mcp

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{{payment_id}}"
    rules:
      - when: {{amount_lte: 10000}}
        decision: allow
      - decision: approve
  k8s.scale:
    effect: "scale:{{cluster}}:{{deployment}}:{{replicas}}"
    decision: allow
  k8s.delete_namespace:
    effect: "delete-ns:{{cluster}}:{{name}}"
    decision: deny
upstreams:
  stripe:
    profile: stripe
    url: {stripe}
    listen: 127.0.0.1:{stripe_port}
    api_key_env: CTRLRUN_DEMO_STRIPE_KEY
    timeout: 5
  cluster:
    profile: kubernetes
    url: {kube}
    cluster: demo
    listen: 127.0.0.1:{kube_port}
    timeout: 5
{more}"""
API_KEY = "sk_test_demo"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def sidecar(workdir: Path, stripe: str, kube: str, more: str = "") -> Iterator[tuple[str, str]]:
    """Run ``ctrlrun proxy`` in a subprocess; yields the two reverse-listener base URLs.

    ``more``: further upstreams for the policy (the MCP scene's)."""
    sp, kp = free_port(), free_port()
    policy = workdir / "ctrlrun.yaml"
    text = POLICY.format(stripe=stripe, kube=kube, stripe_port=sp, kube_port=kp, more=more)
    policy.write_text(text)
    store = sqlite_url(workdir / "state.db")
    log = (workdir / "proxy.log").open("w")
    env = {**_env(), "CTRLRUN_DEMO_STRIPE_KEY": API_KEY}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ctrlrun.cli",
            "proxy",
            "--policy",
            str(policy),
            "--listen",
            "127.0.0.1:0",
            "--store-url",
            store,
            "--principal",
            "demo-agent",
            "--confdir",
            str(workdir / "mitmproxy"),
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        # The start-up line, or give up after 30 s (a proxy that never binds must not hang us).
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if ready else ""
        if "listening" not in line:
            raise CTRLRunError(f"the proxy did not start; see {workdir / 'proxy.log'}")
        yield f"http://127.0.0.1:{sp}", f"http://127.0.0.1:{kp}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}


def _cli(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """An operator's ``ctrlrun`` command on the demo's ledger."""
    store = sqlite_url(workdir / "state.db")
    return subprocess.run(
        [sys.executable, "-m", "ctrlrun.cli", *args, "--store-url", store],
        capture_output=True,
        text=True,
        timeout=60,
    )


def outcome(response: httpx.Response) -> str:
    return str(
        response.headers.get("x-ctrlrun-outcome", f"HTTP {response.status_code} from the remote")
    )


def run(workdir: Path, say: Callable[[str], None] = print) -> int:
    """Play every scenario; returns 0 when each ended as it should."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    ok = True

    def check(cond: bool, what: str) -> None:
        nonlocal ok
        if not cond:
            ok = False
            say(f"   UNEXPECTED: {what}")

    mp = free_port()
    with FakeStripe() as stripe, FakeKubernetes() as kube, demo_mcp.fake(stripe) as mcp:
        pi = stripe.add_payment_intent(amount=50000)["id"]
        kube.add_deployment(namespace="default", name="checkout", replicas=3)
        kube.add_namespace("payments")
        more = demo_mcp.upstream(mcp, stripe, mp)
        with sidecar(workdir, stripe.url, kube.url, more) as (stripe_base, kube_base):
            auth = {"Authorization": f"Bearer {API_KEY}"}
            agent = httpx.Client(timeout=30, trust_env=False)
            say("1. A refund whose reply is lost")
            stripe.fail_next("commit_then_drop")
            r = agent.post(
                f"{stripe_base}/v1/refunds",
                headers=auth,
                data={"payment_intent": pi, "amount": "5000"},
            )
            say(
                f"   agent asks for a 50.00 refund of {pi}: the connection drops after Stripe "
                f"applied it -> {outcome(r)}: {r.json()['ctrlrun']['reason']}"
            )
            r = agent.post(
                f"{stripe_base}/v1/refunds",
                headers=auth,
                data={"payment_intent": pi, "amount": "5000"},
            )
            say(f"   agent retries -> {outcome(r)} (HTTP {r.status_code}): refused, Stripe has it")
            say(f"   Stripe holds {len(stripe.refunds)} refund(s) for {pi}")
            check(len(stripe.refunds) == 1 and outcome(r) == "duplicate", "refund count or retry")

            say("2. A scale whose connection is reset before the cluster applied it")
            scale = f"{kube_base}/apis/apps/v1/namespaces/default/deployments/checkout/scale"
            patch = {"Content-Type": "application/merge-patch+json", "Authorization": "Bearer demo"}
            kube.fail_next("reset_before")
            r = agent.patch(scale, headers=patch, content=b'{"spec":{"replicas":6}}')
            say(
                f"   agent scales checkout to 6: connection reset -> {outcome(r)}: "
                f"{r.json()['ctrlrun']['reason']} (the write may still land: its settle window)"
            )
            r = agent.patch(scale, headers=patch, content=b'{"spec":{"replicas":6}}')
            say(f"   agent retries -> {outcome(r)} (HTTP {r.status_code}): refused, nobody knows")
            check(outcome(r) == "ambiguous", "scale retry inside the settle window")
            replicas = kube.replicas("default", "checkout")
            resolved = _cli(
                workdir, "resolve", "scale:demo:checkout:6", "--failed", "--as", "operator"
            )
            said = resolved.stdout.splitlines()[0] if resolved.stdout else resolved.stderr.strip()
            say(f"   operator sees {replicas} replicas and runs 'ctrlrun resolve --failed': {said}")
            r = agent.patch(scale, headers=patch, content=b'{"spec":{"replicas":6}}')
            replicas = kube.replicas("default", "checkout")
            say(
                f"   agent retries -> HTTP {r.status_code}: the cluster runs checkout at {replicas}"
            )
            check(r.status_code == 200 and replicas == 6, "scale retry")

            say("3. A namespace delete the policy denies")
            r = agent.delete(f"{kube_base}/api/v1/namespaces/payments", headers=patch)
            say(
                f"   agent deletes namespace payments -> {outcome(r)} (HTTP {r.status_code}); "
                f"the cluster saw {kube.count('DELETE')} delete(s)"
            )
            check(outcome(r) == "denied" and kube.count("DELETE") == 0, "denied delete")

            say("4. A large refund that needs a human")
            pi2 = stripe.add_payment_intent(amount=90000)["id"]
            body = {"payment_intent": pi2, "amount": "25000"}
            r = agent.post(f"{stripe_base}/v1/refunds", headers=auth, data=body)
            request_id = r.json()["ctrlrun"].get("request_id", "")
            say(f"   agent asks for 250.00 -> {outcome(r)}: a human must approve {request_id}")
            approved = _cli(workdir, "approve", request_id, "--as", "operator")
            said = approved.stdout.splitlines()[0] if approved.stdout else approved.stderr.strip()
            say(f"   operator runs 'ctrlrun approve {request_id}': {said}")
            changed = agent.post(
                f"{stripe_base}/v1/refunds",
                data={**body, "amount": "90000"},
                headers={**auth, "Ctrlrun-Approval": request_id},
            )
            say(
                f"   agent re-sends with 900.00 instead -> {outcome(changed)}: "
                f"{changed.json()['ctrlrun']['reason']}"
            )
            r = agent.post(
                f"{stripe_base}/v1/refunds",
                data=body,
                headers={**auth, "Ctrlrun-Approval": request_id},
            )
            say(f"   agent re-sends the approved request -> HTTP {r.status_code}: refunded")
            check(outcome(changed) == "approval_invalid" and r.status_code == 200, "approval")
            agent.close()
            demo_mcp.scene(f"http://127.0.0.1:{mp}", mcp, stripe, API_KEY, say, check)
            say(f"   Stripe applied {stripe.writes_applied} write(s) in all")
    say("")
    say(f"Read the receipts: ctrlrun receipts --store-url {sqlite_url(workdir / 'state.db')}")
    return 0 if ok else 1


def main(workdir: str | None = None) -> int:
    started = time.monotonic()
    code = run(Path(workdir or ".ctrlrun/demo").resolve())
    print(f"(demo took {time.monotonic() - started:.1f} s)")
    return code
