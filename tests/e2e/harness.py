"""The end-to-end harness: fake remotes in this process, ``ctrlrun proxy``
in a subprocess (the real command), and a helper to read its ledger."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ctrlrun import clocks, steady
from ctrlrun.store import SQLiteStateStore
from ctrlrun.testing import FakeKubernetes, FakeStripe

if TYPE_CHECKING:
    from inprocess import InProcess

    from ctrlrun.receipts import Receipt

STRIPE_KEY = "sk_test_e2e_4242424242"
KUBE_TOKEN = "kube-e2e-token-7f3a9c"
START = re.compile(r"proxy (?P<host>[\d.]+):(?P<port>\d+)")
# A kubeconfig for a cluster served over TLS: its server, CA file, a token and ``{proxy}``,
# empty or the line ``proxy_url_line`` gives.
KUBECONFIG_TLS = """\
apiVersion: v1
kind: Config
clusters:
- name: prod-eu
  cluster:
    server: {server}
    certificate-authority: {ca}
{proxy}users:
- name: agent
  user:
    token: {token}
contexts:
- name: prod-eu
  context: {{cluster: prod-eu, user: agent, namespace: default}}
current-context: prod-eu
"""


_GIVEN: set[int] = set()  # ports free_port handed out in this process


def free_port() -> int:
    """A loopback port free now, and never one handed out before in this process: the kernel
    may give a port just closed again, so two listens of one config could name the same."""
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port
    raise RuntimeError("no loopback port free that was not handed out already")


@contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port that refuses every connection for as long as the block runs.

    The socket stays bound and never listens: connecting is refused, and no other server (nor an
    outgoing connection's own ephemeral port, which would connect to itself) can take the port.
    A port bound and closed again, as ``free_port`` gives, can be reused by anything meanwhile.
    """
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


@dataclass
class Sidecar:
    """One running ``ctrlrun proxy`` (a subprocess, or in this process) and what it guards."""

    workdir: Path
    policy: Path
    store_url: str
    proxy_url: str = ""
    stripe_base: str = ""  # reverse listener for the fake Stripe
    kube_base: str = ""  # reverse listener for the fake Kubernetes
    admin_url: str = ""
    proc: subprocess.Popen[str] | None = None
    log: Path = field(default_factory=Path)
    start_line: str = ""
    inproc: InProcess | None = None  # set when the proxy runs in this process

    def store(self) -> SQLiteStateStore:
        return SQLiteStateStore(self.store_url.removeprefix("sqlite:///"), create=False)

    def effect_state(self, key: str) -> str | None:
        from ctrlrun import ledger

        store = self.store()
        try:
            with store.reading() as conn:
                rec = ledger.get_effect(conn, key)
            return None if rec is None else rec.state.value
        finally:
            store.close()

    def receipts(self) -> list[Receipt]:
        """Every receipt in the ledger, in chain order (read from the store, as ``store``)."""
        from ctrlrun.receipts import load_receipts

        store = self.store()
        try:
            with store.reading() as conn:
                return load_receipts(conn)
        finally:
            store.close()

    @property
    def proxy_port(self) -> int:
        """The port of the explicit proxy (``proxy_url``), on 127.0.0.1."""
        return int(self.proxy_url.rsplit(":", 1)[1])

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A ``ctrlrun`` command: in this process beside an in-process proxy, else a process."""
        if self.inproc is not None:
            from inprocess import cli

            return cli(args, clean_env())
        return subprocess.run(
            [sys.executable, "-m", "ctrlrun.cli", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.workdir,
            env=clean_env(),
        )

    def reload(self) -> None:
        """Reload the policy: SIGHUP, or its in-process equivalent."""
        if self.inproc is not None:
            self.inproc.reload()
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGHUP)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.inproc is not None:
            assert sig == signal.SIGTERM, "an in-process proxy cannot be killed; use a subprocess"
            return self.inproc.stop()
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return int(self.proc.returncode)


def proxy_url_line(sc: Sidecar) -> str:
    """The kubeconfig line (``KUBECONFIG_TLS``'s ``{proxy}``) that sends a cluster's requests
    through ``sc``'s explicit proxy."""
    return f"    proxy-url: {sc.proxy_url}\n"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update({"STRIPE_E2E_KEY": STRIPE_KEY}, **extra)
    return env


POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{{payment_id}}"
    rules:
      - when: {{amount_lte: 100000}}
        decision: allow
      - decision: approve
  stripe.cancel_payment_intent:
    effect: "cancel:{{payment_intent}}"
    decision: allow
  stripe.payout:
    decision: deny
  k8s.scale:
    effect: "scale:{{cluster}}:{{deployment}}:{{replicas}}"
    decision: allow
  k8s.delete_namespace:
    effect: "delete-ns:{{cluster}}:{{name}}"
    decision: deny
  k8s.delete_deployment:
    effect: "delete-deploy:{{cluster}}:{{namespace}}:{{deployment}}"
    decision: allow
upstreams:
  stripe:
    profile: stripe
    url: {stripe}
    listen: 127.0.0.1:{stripe_port}
    api_key_env: STRIPE_E2E_KEY
    timeout: {timeout}
    reconcile: {reconcile}
  cluster:
    profile: kubernetes
    url: {kube}
    cluster: prod-eu
    listen: 127.0.0.1:{kube_port}
    timeout: {timeout}
    reconcile: {reconcile}
"""


def start_sidecar(
    workdir: Path,
    stripe: FakeStripe,
    kube: FakeKubernetes,
    *,
    policy_text: str | None = None,
    timeout: int = 5,
    reconcile: str = "eager",
    extra_args: tuple[str, ...] = (),
    admin: bool = False,
    env: dict[str, str] | None = None,
    store_url: str | None = None,
    sweep_interval: float | None = None,
    in_process: bool = False,
) -> Sidecar:
    """Write a policy naming the fakes and start ``ctrlrun proxy`` on free loopback ports.

    The ledger is ``workdir/state.db`` unless ``store_url`` names another (e.g. PostgreSQL;
    ``Sidecar.store``/``effect_state`` then do not apply). ``in_process`` runs the proxy in a
    thread of this process (``inprocess.py``): for tests of logic, where a subprocess adds only
    its start-up time; a subprocess for what only the command shows (its start-up line,
    signals, a SIGKILL, its log setup).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    sp, kp = free_port(), free_port()
    policy = workdir / "ctrlrun.yaml"
    text = policy_text or POLICY
    policy.write_text(
        text.format(
            stripe=stripe.url,
            kube=kube.url,
            stripe_port=sp,
            kube_port=kp,
            timeout=timeout,
            reconcile=reconcile,
        )
    )
    sc = Sidecar(
        workdir,
        policy,
        store_url or f"sqlite:///{workdir / 'state.db'}",
        stripe_base=f"http://127.0.0.1:{sp}",
        kube_base=f"http://127.0.0.1:{kp}",
        log=workdir / "proxy.log",
    )
    if in_process:
        assert not extra_args, "in process, name the settings (sweep_interval=...)"
        line = _start_in_process(sc, admin=admin, env=env, sweep_interval=sweep_interval)
    else:
        if sweep_interval is not None:
            extra_args += ("--sweep-interval", str(sweep_interval))
        line = _start_subprocess(sc, extra_args, admin=admin, env=env)
    sc.start_line = line.strip()
    match = START.search(line)
    assert match, line
    sc.proxy_url = f"http://127.0.0.1:{match['port']}"
    admin_match = re.search(r"admin ([\d.]+):(\d+)", line)
    if admin_match:
        sc.admin_url = f"http://{admin_match[1]}:{admin_match[2]}"
    return sc


@contextmanager
def running_sidecar(
    workdir: Path, stripe: FakeStripe, kube: FakeKubernetes, **options: Any
) -> Iterator[Sidecar]:
    """``start_sidecar(workdir, stripe, kube, **options)`` for the length of a block: stopped
    (SIGTERM, or its in-process equivalent) however the block ends."""
    sc = start_sidecar(workdir, stripe, kube, **options)
    try:
        yield sc
    finally:
        sc.stop()


@contextmanager
def fake_remotes(
    *deployments: str, replicas: int = 3, tls: bool = False
) -> Iterator[tuple[FakeStripe, FakeKubernetes]]:
    """A fake Stripe and a fake Kubernetes on loopback for the length of a block, the cluster
    holding a deployment of ``replicas`` in namespace ``default`` for each name given."""
    with FakeStripe(tls=tls) as stripe, FakeKubernetes(tls=tls) as kube:
        for name in deployments:
            kube.add_deployment(namespace="default", name=name, replicas=replicas)
        yield stripe, kube


def _start_subprocess(
    sc: Sidecar, extra_args: tuple[str, ...], *, admin: bool, env: dict[str, str] | None
) -> str:
    args = [
        sys.executable,
        "-m",
        "ctrlrun.cli",
        "proxy",
        "--policy",
        str(sc.policy),
        "--listen",
        "127.0.0.1:0",
        "--store-url",
        sc.store_url,
        "--principal",
        "e2e-agent",
        "--confdir",
        str(sc.workdir / "mitm"),
        *extra_args,
    ]
    if admin:
        args += ["--admin", f"127.0.0.1:{free_port()}"]
    with sc.log.open("w") as log:
        sc.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env or clean_env(),
            cwd=sc.workdir,
        )
    assert sc.proc.stdout is not None
    deadline = time.monotonic() + 30
    line = ""
    while time.monotonic() < deadline and sc.proc.poll() is None:
        line = sc.proc.stdout.readline()
        if "listening" in line:
            break
    if "listening" not in line:
        sc.stop(signal.SIGKILL)
        raise AssertionError(f"proxy did not start: {sc.log.read_text()[-2000:]}")
    return line


def _start_in_process(
    sc: Sidecar, *, admin: bool, env: dict[str, str] | None, sweep_interval: float | None
) -> str:
    from inprocess import InProcess

    from ctrlrun.proxy.server import ProxySettings

    settings = ProxySettings(
        policy=str(sc.policy),
        listen=("127.0.0.1", 0),
        store_url=sc.store_url,
        principal="e2e-agent",
        admin=("127.0.0.1", free_port()) if admin else None,
        confdir=str(sc.workdir / "mitm"),
        sweep_interval=60.0 if sweep_interval is None else sweep_interval,
    )
    variables = {"STRIPE_E2E_KEY": STRIPE_KEY, **(env or {})}
    sc.inproc = InProcess(settings, sc.log, variables)
    return sc.inproc.start()


def time_passes(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """``seconds`` go by for this process: its wall clock (the ledger's, on SQLite) and the
    monotonic clock it keeps its attempts' stamps on (a step of the wall alone is not time)."""
    monkeypatch.setattr(clocks, "_offset", lambda: timedelta(seconds=seconds))
    monkeypatch.setattr(steady, "monotonic", lambda: time.monotonic() + seconds)
