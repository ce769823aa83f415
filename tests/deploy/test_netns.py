"""The shipped egress rules, for real, in a network namespace this test creates.

The namespace plays the pod: the sidecar (``ctrlrun proxy``) runs in it under the sidecar's UID,
the agent under another UID, and ``deploy/ctrlrun-egress.sh`` is applied exactly as the init
container applies it. The fake remote listens in the host namespace, at the far end of a veth
pair, so the only way to it leaves the "pod". Owner mode: the agent reaches the remote only
through the sidecar, whatever it does with proxy variables. Transparent mode: an agent that
knows nothing of proxies is guarded all the same.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ctrlrun.testing import FakeStripe

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "ctrlrun-egress.sh"
AGENT_UID = 10002  # the manifests' agent UID
PROXY_PORT = 8080
KEY = "sk_test_netns_4242"
REMOTE_NAME = "api.stripe.test"  # the remote's name inside the pod
TLS_ARGS = ("--insecure",)  # reachability only: a handshake that happens is enough

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{{payment_id}}"
    rules:
      - when: {{amount_lte: 10000}}
        decision: allow
upstreams:
  stripe:
    profile: stripe
    url: {url}
{ca_file}    timeout: 5
    reconcile: "off"
{extra}"""


def _unavailable() -> str | None:
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "needs root to create a network namespace and netfilter rules (CI runs as root)"
    for tool in ("ip", "iptables", "setpriv", "curl"):
        if shutil.which(tool) is None:
            return f"needs {tool} (apt-get install iproute2 iptables util-linux curl)"
    return None


pytestmark = pytest.mark.skipif(_unavailable() is not None, reason=str(_unavailable()))


def _sidecar_uid() -> int:
    """The manifests' sidecar UID, or root where that UID cannot run this interpreter."""
    drop = ["setpriv", "--reuid=10001", "--regid=10001", "--clear-groups", "--", "env", "-i"]
    probe = [*drop, sys.executable, "-c", "import ctrlrun.proxy.server"]
    try:
        ok = subprocess.run(probe, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return 10001 if ok else 0


SIDECAR_UID = _sidecar_uid() if _unavailable() is None else 10001


def run(*argv: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {result.stderr.strip()}")
    return result


@dataclass
class Pod:
    """A network namespace joined to the host by a veth pair (host end ``gateway``)."""

    name: str
    gateway: str  # the host end's address: where the fake remote listens
    gateway6: str  # the same over IPv6
    workdir: Path  # readable by both UIDs, writable by the sidecar's

    def as_uid(self, uid: int, *argv: str, env: tuple[str, ...] = ()) -> list[str]:
        base = ("PATH=/usr/sbin:/usr/bin:/bin", f"HOME={self.workdir}", *env)
        drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
        return ["ip", "netns", "exec", self.name, *drop, "env", "-i", *base, *argv]

    def egress(self, mode: str) -> None:
        """The init container's step: the shipped script, as root inside the namespace."""
        env = [f"CTRLRUN_UID={SIDECAR_UID}", f"CTRLRUN_MODE={mode}", "CTRLRUN_DNS=none"]
        run("ip", "netns", "exec", self.name, "env", *env, "sh", str(SCRIPT))

    def reach(self, uid: int, url: str) -> tuple[int, str]:
        """A GET by curl under ``uid``, straight to ``url``: curl's exit code and the status."""
        argv = self.as_uid(uid, "curl", "-sS", "--max-time", "10", "--noproxy", "*", *TLS_ARGS)
        out = run(*argv, "-o", "/dev/null", "-w", "%{http_code}", url, timeout=60, check=False)
        return out.returncode, out.stdout.strip()

    def agent(self, url: str, amount: int, *curl_args: str) -> tuple[int, str]:
        """One refund by curl under the agent's UID, its proxy variables naming the sidecar.

        Returns curl's exit code and ``"<status> <X-Ctrlrun-Outcome>"``.
        """
        proxies = tuple(f"{v}=http://127.0.0.1:{PROXY_PORT}" for v in ("http_proxy", "HTTPS_PROXY"))
        argv = self.as_uid(AGENT_UID, "curl", "-sS", "--max-time", "10", *curl_args, env=proxies)
        if url.startswith("https://"):
            argv += ["--cacert", str(self.workdir / "agent-ca.pem")]
        out = run(
            *argv,
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %header{x-ctrlrun-outcome}",
            "-H",
            f"Authorization: Bearer {KEY}",
            "-d",
            f"payment_intent=pi_{amount}",
            "-d",
            f"amount={amount}",
            f"{url}/v1/refunds",
            timeout=60,
            check=False,
        )
        return out.returncode, out.stdout.strip()


@pytest.fixture
def pod() -> Iterator[Pod]:
    tag = secrets.token_hex(3)
    name, host_end, pod_end = f"ctrlrun-test-{tag}", f"crh{tag}", f"crp{tag}"
    octet = int(tag[:2], 16)
    gateway, address = f"198.18.{octet}.1", f"198.18.{octet}.2"  # RFC 2544 test range
    prefix6 = f"fd53:{tag[:4]}:{tag[4:]}"  # unique local addresses
    gateway6, address6 = f"{prefix6}::1", f"{prefix6}::2"
    workdir = Path(tempfile.mkdtemp(prefix="ctrlrun-netns-"))
    etc = Path("/etc/netns") / name
    try:
        run("ip", "netns", "add", name)
        # Names inside the pod: `ip netns exec` mounts this file over /etc/hosts.
        etc.mkdir(parents=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{gateway} {REMOTE_NAME}\n")
        run("ip", "link", "add", host_end, "type", "veth", "peer", "name", pod_end)
        run("ip", "link", "set", pod_end, "netns", name)
        run("ip", "addr", "add", f"{gateway}/30", "dev", host_end)
        run("ip", "addr", "add", f"{gateway6}/64", "dev", host_end, "nodad")
        run("ip", "link", "set", host_end, "up")
        inside = ("ip", "netns", "exec", name, "ip")
        run(*inside, "addr", "add", f"{address}/30", "dev", pod_end)
        run(*inside, "addr", "add", f"{address6}/64", "dev", pod_end, "nodad")
        run(*inside, "link", "set", pod_end, "up")
        run(*inside, "link", "set", "lo", "up")
        workdir.chmod(0o755)
        os.chown(workdir, SIDECAR_UID, SIDECAR_UID)
        yield Pod(name, gateway, gateway6, workdir)
    finally:
        run("ip", "netns", "del", name, check=False)  # takes the veth pair with it
        shutil.rmtree(etc, ignore_errors=True)
        run("ip", "link", "del", host_end, check=False)
        shutil.rmtree(workdir, ignore_errors=True)


class Sidecar:
    """``ctrlrun proxy`` inside the pod, under the sidecar's UID, until ``stop``."""

    def __init__(
        self, pod: Pod, remote: FakeStripe, mode: str, *, url: str = "", extra: str = ""
    ) -> None:
        self.pod = pod
        policy = pod.workdir / "ctrlrun.yaml"
        ca_file = ""
        if remote.ca_file:  # the sidecar's UID may not read the fakes' CA where it lives
            shutil.copy(remote.ca_file, pod.workdir / "remote-ca.pem")
            ca_file = f"    ca_file: {pod.workdir / 'remote-ca.pem'}\n"
        policy.write_text(POLICY.format(url=url or remote.url, ca_file=ca_file, extra=extra))
        self.store_url = f"sqlite:///{pod.workdir / 'state.db'}"
        argv = pod.as_uid(
            SIDECAR_UID,
            sys.executable,
            "-m",
            "ctrlrun.cli",
            "proxy",
            "--policy",
            str(policy),
            "--listen",
            f"127.0.0.1:{PROXY_PORT}",
            "--mode",
            mode,
            "--principal",
            "refund-agent",
            "--confdir",
            str(pod.workdir / "ca"),
            "--store-url",
            self.store_url,
        )
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.output: list[str] = []
        self._started = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._started.wait(60) or not any("listening" in x for x in self.output):
            self.stop()
            raise AssertionError("the sidecar did not start:\n" + "".join(self.output))
        # What the agent trusts: the proxy's CA, as the ctrlrun-ca init container shares it.
        agent_ca = pod.workdir / "agent-ca.pem"
        shutil.copy(pod.workdir / "ca" / "mitmproxy-ca-cert.pem", agent_ca)
        agent_ca.chmod(0o644)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if "listening" in line:
                self._started.set()
        self._started.set()  # it ended: wake the waiter

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def receipts(self) -> list[dict[str, object]]:
        out = run(
            sys.executable,
            "-m",
            "ctrlrun.cli",
            "receipts",
            "--json",
            "--store-url",
            self.store_url,
        ).stdout
        return [r for r in map(json.loads, out.splitlines()) if r.get("kind") == "receipt"]


def seeded(stripe: FakeStripe) -> FakeStripe:
    for amount in (500, 700, 50_000):
        stripe.add_payment_intent(f"pi_{amount}", amount=amount)
    return stripe


@pytest.fixture
def remote(pod: Pod) -> Iterator[FakeStripe]:
    with FakeStripe(host=pod.gateway) as stripe:
        yield seeded(stripe)


@pytest.fixture
def remote6(pod: Pod) -> Iterator[FakeStripe]:
    with FakeStripe(host=pod.gateway6) as stripe:
        yield seeded(stripe)


@pytest.fixture
def remote_tls(pod: Pod) -> Iterator[FakeStripe]:
    with FakeStripe(host=pod.gateway, tls=True) as stripe:
        yield seeded(stripe)


def refunds(remote: FakeStripe) -> int:
    return remote.count("POST", "/v1/refunds")


def test_owner_rules_leave_the_sidecar_as_the_only_way_out(
    pod: Pod, remote: FakeStripe, remote6: FakeStripe
) -> None:
    pod.egress("owner")
    sidecar = Sidecar(pod, remote, "regular")
    try:
        # The way out exists, for the sidecar's UID, over IPv4 and IPv6 (the remote answers
        # 401: no key) ...
        for fake in (remote, remote6):
            assert pod.reach(SIDECAR_UID, fake.url + "/v1/balance") == (0, "401"), fake.url
        # ... and not for the agent's, even ignoring its proxy variables: refused by the
        # kernel (curl's 7: could not connect).
        for fake in (remote, remote6):
            assert pod.reach(AGENT_UID, fake.url + "/v1/balance") == (7, "000"), fake.url
        assert pod.agent(remote.url, 500, "--noproxy", "*") == (7, "000"), "reached the remote"
        assert refunds(remote) == 0 and remote6.requests == [("GET", "/v1/balance")]
        # The same request through the sidecar is guarded: allowed, then denied by policy.
        via = ("--proxy", f"http://127.0.0.1:{PROXY_PORT}")
        assert pod.agent(remote.url, 500, *via) == (0, "200")
        assert pod.agent(remote.url, 50_000, *via) == (0, "403 denied")
    finally:
        sidecar.stop()
    assert refunds(remote) == 1
    results = sorted(str(r["result"]) for r in sidecar.receipts())
    assert results == ["committed", "denied"], results


def test_transparent_mode_guards_a_client_that_knows_nothing_of_proxies(
    pod: Pod, remote: FakeStripe
) -> None:
    pod.egress("transparent")
    sidecar = Sidecar(pod, remote, "transparent")
    try:
        assert "transparent proxy 127.0.0.1" in sidecar.output[-1], sidecar.output
        # No proxy at all: the kernel hands the connection to the sidecar.
        assert pod.agent(remote.url, 700, "--noproxy", "*") == (0, "200")
        assert pod.agent(remote.url, 50_000, "--noproxy", "*") == (0, "403 denied")
    finally:
        sidecar.stop()
    assert refunds(remote) == 1
    receipts = sidecar.receipts()
    assert sorted(str(r["result"]) for r in receipts) == ["committed", "denied"], receipts
    assert {str(r["action"]) for r in receipts} == {"stripe.refund"}


def test_transparent_mode_intercepts_tls_and_refuses_what_it_cannot_redirect(
    pod: Pod, remote_tls: FakeStripe, remote6: FakeStripe
) -> None:
    pod.egress("transparent")
    sidecar = Sidecar(pod, remote_tls, "transparent")
    try:
        # HTTPS straight to the remote's address: the agent trusts only the proxy's CA.
        assert pod.agent(remote_tls.url, 700, "--noproxy", "*") == (0, "200")
        assert pod.agent(remote_tls.url, 700, "--noproxy", "*") == (0, "409 duplicate")
        assert pod.agent(remote_tls.url, 50_000, "--noproxy", "*") == (0, "403 denied")
        # IPv6 is not redirected: refused outright.
        assert pod.reach(AGENT_UID, remote6.url + "/v1/balance") == (7, "000")
    finally:
        sidecar.stop()
    assert refunds(remote_tls) == 1 and remote6.requests == []
    results = sorted(str(r["result"]) for r in sidecar.receipts())
    assert results == ["blocked", "committed", "denied"], results


def test_transparent_mode_knows_a_named_upstream_by_its_address_and_applies_egress(
    pod: Pod, remote: FakeStripe
) -> None:
    pod.egress("transparent")
    with (
        FakeStripe(host=pod.gateway) as other,  # neither an upstream nor allowed
        FakeStripe(host=pod.gateway, tls=True) as other_tls,
    ):
        named = f"http://{REMOTE_NAME}:{remote.port}"
        egress = "egress: {default: deny}\n"
        sidecar = Sidecar(pod, remote, "transparent", url=named, extra=egress)
        try:
            # The policy names the remote; the agent dials it by address, or by that name.
            assert pod.agent(remote.url, 50_000, "--noproxy", "*") == (0, "403 denied")
            assert pod.agent(named, 700, "--noproxy", "*") == (0, "200")
            # Elsewhere, over HTTP, TLS (intercepted to be refused) or neither: refused, with
            # a receipt each.
            assert pod.reach(AGENT_UID, other.url + "/v1/balance") == (0, "403")
            assert pod.reach(AGENT_UID, other_tls.url + "/v1/balance") == (0, "403")
            raw = pod.as_uid(AGENT_UID, "curl", "-sS", "--max-time", "5", "--noproxy", "*")
            target = f"telnet://{pod.gateway}:{other.port}"
            subprocess.run([*raw, target], input="\x00\x01 not http\n", timeout=60, text=True)
        finally:
            sidecar.stop()
        assert other.requests == [] and other_tls.requests == []
    assert refunds(remote) == 1
    receipts = sidecar.receipts()
    reasons = [str(r["decision_reason"]) for r in receipts]
    assert reasons == ["no_matching_rule", "rule[0]"] + ["egress_denied"] * 3, reasons
    assert [r["arguments"]["method"] for r in receipts[2:]] == ["GET", "GET", "TCP"]  # type: ignore[index]
