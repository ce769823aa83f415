"""Reads are relayed as they arrive: a Kubernetes watch through the sidecar delivers each event
when the server sends it, so ``kubectl delete namespace`` (which waits on a watch) returns
when the namespace is gone, not when the watch times out."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import kubernetes.client
import kubernetes.watch
import pytest
from harness import KUBE_TOKEN, POLICY, Sidecar, clean_env, running_sidecar
from test_kubectl import KUBECONFIG, kubectl

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(120)
WATCH_SECONDS = 30  # the server ends the watch after this: a buffered relay waits this long
FINALIZE_SECONDS = 1.5


def core_api(base: str, proxy: str | None = None) -> kubernetes.client.CoreV1Api:
    cfg = kubernetes.client.Configuration(
        host=base,
        api_key={"authorization": KUBE_TOKEN},
        api_key_prefix={"authorization": "Bearer"},
    )
    cfg.proxy = proxy
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(cfg))


def first_added_after(api: kubernetes.client.CoreV1Api, kube: FakeKubernetes, name: str) -> float:
    """Watch namespaces, create ``name`` once the watch is open; seconds until its event came."""
    rv = api.list_namespace().metadata.resource_version
    created: list[float] = []

    def create() -> None:
        time.sleep(0.3)  # the watch is open by then; an event before it would be replayed anyway
        created.append(time.monotonic())
        kube.add_namespace(name)

    threading.Thread(target=create, daemon=True).start()
    watch = kubernetes.watch.Watch()
    try:
        for event in watch.stream(
            api.list_namespace, resource_version=rv, timeout_seconds=WATCH_SECONDS
        ):
            if event["type"] == "ADDED" and event["object"].metadata.name == name:
                return time.monotonic() - created[0]
    finally:
        watch.stop()
    raise AssertionError(f"no ADDED event for {name}")


@pytest.mark.parametrize("route", ["reverse", "explicit"])
def test_a_watch_event_arrives_when_the_server_sends_it(
    sidecar: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], route: str
) -> None:
    _, kube = fakes
    if route == "reverse":
        api = core_api(sidecar.kube_base)
    else:
        api = core_api(kube.url, proxy=sidecar.proxy_url)  # HTTP_PROXY, as an agent sets it
    lag = first_added_after(api, kube, f"watched-{route}")
    # The fake sends within 0.05 s of the change; buffered, the event would wait 30 s.
    assert lag < 0.5


KUBECTL = shutil.which("kubectl")


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_kubectl_delete_namespace_returns_when_the_namespace_is_gone(tmp_path: Path) -> None:
    policy = POLICY.replace(
        'effect: "delete-ns:{{cluster}}:{{name}}"\n    decision: deny',
        'effect: "delete-ns:{{cluster}}:{{name}}"\n    decision: allow',
    )
    assert policy != POLICY
    with (
        FakeStripe() as stripe,
        FakeKubernetes(finalize_namespaces_after=FINALIZE_SECONDS) as kube,
    ):
        kube.add_namespace("doomed")
        with running_sidecar(
            tmp_path / "sc", stripe, kube, policy_text=policy, in_process=True
        ) as sidecar:
            home = tmp_path / "home"
            home.mkdir()
            config = KUBECONFIG.format(server=sidecar.kube_base, token=KUBE_TOKEN)
            (home / "kubeconfig").write_text(config)
            done, elapsed = kubectl(home, "delete", "namespace", "doomed")
            assert done.returncode == 0, done.stderr
            assert 'namespace "doomed" deleted' in done.stdout
            assert "doomed" not in kube.namespaces
            # Deleted at once, gone FINALIZE_SECONDS later: kubectl's watch saw it within 2 s.
            assert elapsed < FINALIZE_SECONDS + 2
            assert sidecar.effect_state("delete-ns:prod-eu:doomed") == "committed"


class Trickle:
    """A loopback server that answers one GET in two parts and sends the second only once the
    client says it has the first: a proxy that buffers the body never lets the client say it."""

    def __init__(self, framing: str) -> None:
        self.framing = (
            framing  # "chunked" or "close" (no length: the body ends with the connection)
        )
        self.have_first = threading.Event()
        self.released_by_client: bool | None = None
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(30)
        conn, _ = self.sock.accept()
        with conn:
            conn.settimeout(30)
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(4096)
            chunked = self.framing == "chunked"
            framing = b"Transfer-Encoding: chunked\r\n" if chunked else b"Connection: close\r\n"
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n" + framing + b"\r\n")
            conn.sendall(b"6\r\nfirst\n\r\n" if chunked else b"first\n")
            self.released_by_client = self.have_first.wait(10)
            conn.sendall(b"7\r\nsecond\n\r\n0\r\n\r\n" if chunked else b"second\n")
        self.sock.close()


def fetch_in_parts(proxy: str, trickle: Trickle) -> bytes:
    """GET the trickle through the explicit proxy; say when the first part arrived."""
    host, port = proxy.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        target = f"http://127.0.0.1:{trickle.port}/download"
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{trickle.port}\r\n\r\n".encode())
        got = b""
        while b"second" not in got:
            chunk = sock.recv(4096)
            if not chunk:
                break
            got += chunk
            if b"first" in got:
                trickle.have_first.set()
        return got


@pytest.mark.parametrize("framing", ["chunked", "close"])
@pytest.mark.parametrize("guarded", [True, False])
def test_a_body_is_relayed_as_it_arrives(tmp_path: Path, framing: str, guarded: bool) -> None:
    trickle = Trickle(framing)
    policy = POLICY
    if guarded:  # a read of an upstream, or traffic to a host that is no upstream
        policy += f"  trickle:\n    profile: http\n    url: http://127.0.0.1:{trickle.port}\n"
    with (
        FakeStripe() as stripe,
        FakeKubernetes() as kube,
        running_sidecar(tmp_path, stripe, kube, policy_text=policy, in_process=True) as sidecar,
    ):
        got = fetch_in_parts(sidecar.proxy_url, trickle)
    trickle.thread.join(15)
    assert b"first" in got and b"second" in got
    assert trickle.released_by_client is True  # the first part reached the client on its own


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_kubectl_rollout_status_returns_when_the_rollout_ends(
    sidecar: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], tmp_path: Path
) -> None:
    _, kube = fakes
    kube.hold_rollout("default", "checkout")
    home = tmp_path / "home"
    home.mkdir()
    config = KUBECONFIG.format(server=sidecar.kube_base, token=KUBE_TOKEN)
    (home / "kubeconfig").write_text(config)
    assert KUBECTL is not None
    env = clean_env(HOME=str(home), KUBECONFIG=str(home / "kubeconfig"))
    argv = [KUBECTL, "rollout", "status", "deployment/checkout", "--timeout=60s"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env) as waiting:
        try:
            time.sleep(1.5)  # long enough for it to be waiting on its watch
            assert waiting.poll() is None, "rollout status returned before the rollout ended"
            finished = time.monotonic()
            kube.finish_rollout("default", "checkout")
            out, _ = waiting.communicate(timeout=30)
            elapsed = time.monotonic() - finished
        finally:
            waiting.kill()
    assert waiting.returncode == 0
    assert 'deployment "checkout" successfully rolled out' in out
    assert elapsed < 2  # the watch event came through; buffered, it would wait up to 60 s
