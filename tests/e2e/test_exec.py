"""Kubernetes exec, attach and portforward through the sidecar: decided by policy and recorded,
relayed by the proxy when allowed (WebSocket and SPDY), reaching nothing when denied."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
from harness import KUBE_TOKEN, POLICY, Sidecar, fake_remotes, running_sidecar
from test_kubectl import KUBECONFIG, kubectl

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(120)
KUBECTL = shutil.which("kubectl")
EXEC = "/api/v1/namespaces/default/pods/web-0/exec"
ALLOW = """\
  k8s.exec:
    decision: allow
  k8s.attach:
    decision: allow
  k8s.port_forward:
    decision: allow
upstreams:
"""


@pytest.fixture
def allowing(tmp_path: Path) -> Any:
    """A sidecar whose policy allows exec, attach and port-forward, over a cluster with a pod."""
    policy = POLICY.replace("upstreams:\n", ALLOW, 1)
    with fake_remotes() as (stripe, kube):
        kube.add_pod("default", "web-0")
        with running_sidecar(
            tmp_path / "sc", stripe, kube, policy_text=policy, in_process=True
        ) as sc:
            yield sc, kube


def receipts(sc: Sidecar) -> list[dict[str, Any]]:
    out = sc.cli("receipts", "--json", "--store-url", sc.store_url)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    return [doc for doc in lines if doc["kind"] == "receipt"]


def home_for(tmp_path: Path, server: str) -> Path:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "kubeconfig").write_text(KUBECONFIG.format(server=server, token=KUBE_TOKEN))
    return home


def raw_upgrade(proxy: str, target: str, upgrade: str, method: str = "POST") -> socket.socket:
    """Send an upgrade request through the explicit proxy; the socket, after the head is sent."""
    host, port = proxy.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    head = (
        f"{method} {target} HTTP/1.1\r\nHost: {target.split('/')[2]}\r\n"
        f"Authorization: Bearer {KUBE_TOKEN}\r\nConnection: Upgrade\r\nUpgrade: {upgrade}\r\n"
        "X-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n"
    )
    sock.sendall(head.encode())
    return sock


def read_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_kubectl_exec_allowed_runs_through_the_sidecar_and_is_recorded(
    allowing: tuple[Sidecar, FakeKubernetes], tmp_path: Path
) -> None:
    sc, kube = allowing
    done, _ = kubectl(home_for(tmp_path, sc.kube_base), "exec", "web-0", "-c", "app", "--", "date")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ran date")  # the remote's output, relayed over the WebSocket
    [session] = kube.sessions
    assert (session.kind, session.container, session.command[0]) == ("exec", "app", "date")
    assert session.protocol.endswith("channel.k8s.io")
    [receipt] = receipts(sc)
    assert (receipt["action"], receipt["decision"], receipt["result"]) == (
        "k8s.exec",
        "allow",
        "committed",
    )
    assert receipt["arguments"]["command"][0] == "date"
    assert receipt["arguments"]["pod"] == "web-0"


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_kubectl_exec_denied_reaches_nothing_and_leaves_receipts(
    sidecar: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], tmp_path: Path
) -> None:
    _, kube = fakes
    kube.add_pod("default", "web-0")
    done, _ = kubectl(
        home_for(tmp_path, sidecar.kube_base), "exec", "web-0", "--", "rm", "-rf", "/"
    )
    assert done.returncode != 0
    assert "ctrlrun:" in done.stderr
    assert kube.sessions == []
    assert kube.count(path=EXEC) == 0
    # kubectl tries the WebSocket, then falls back to SPDY: each is decided, each is recorded.
    got = receipts(sidecar)
    assert got and all((r["action"], r["decision"]) == ("k8s.exec", "deny") for r in got)
    assert got[0]["arguments"]["command"] == ["rm", "-rf", "/", "--request-timeout=20s"]


def test_python_client_stream_exec_is_relayed(allowing: tuple[Sidecar, FakeKubernetes]) -> None:
    import kubernetes.client
    from kubernetes.stream import stream

    sc, kube = allowing
    cfg = kubernetes.client.Configuration(
        host=sc.kube_base,
        api_key={"authorization": KUBE_TOKEN},
        api_key_prefix={"authorization": "Bearer"},
    )
    cfg.proxy = None
    api = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(cfg))
    out = stream(
        api.connect_get_namespaced_pod_exec,
        "web-0",
        "default",
        command=["cat", "/etc/hostname"],
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
        _request_timeout=20,
    )
    assert out == "ran cat /etc/hostname in app\n"
    assert [s.command for s in kube.sessions] == [("cat", "/etc/hostname")]
    assert [r["result"] for r in receipts(sc)] == ["committed"]


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_spdy_exec_is_decided_and_its_stream_relayed_both_ways(
    allowing: tuple[Sidecar, FakeKubernetes], method: str
) -> None:
    sc, kube = allowing
    target = f"{kube.url}{EXEC}?command=ls&stdout=true"
    with raw_upgrade(sc.proxy_url, target, "SPDY/3.1", method) as sock:
        head = read_head(sock)
        assert head.startswith(b"HTTP/1.1 101"), head
        sock.sendall(b"spdy frames")
        echoed = b""
        while len(echoed) < len(b"spdy frames"):
            chunk = sock.recv(4096)
            assert chunk, "the relay closed the stream"
            echoed += chunk
        assert echoed == b"spdy frames"
    assert [(s.kind, s.command, s.protocol) for s in kube.sessions] == [
        ("exec", ("ls",), "spdy/3.1")
    ]
    [receipt] = receipts(sc)
    assert (receipt["action"], receipt["result"]) == ("k8s.exec", "committed")


@pytest.mark.parametrize(
    ("path", "action"),
    [
        (f"{EXEC}?command=sh", "k8s.exec"),
        ("/api/v1/namespaces/default/pods/web-0/attach?container=app", "k8s.attach"),
        ("/api/v1/namespaces/default/pods/web-0/portforward", "k8s.port_forward"),
    ],
)
@pytest.mark.parametrize("upgrade", ["SPDY/3.1", "websocket"])
def test_denied_stream_writes_reach_nothing(
    sidecar: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], path: str, action: str, upgrade: str
) -> None:
    _, kube = fakes
    kube.add_pod("default", "web-0")
    with raw_upgrade(sidecar.proxy_url, f"{kube.url}{path}", upgrade, "GET") as sock:
        head = read_head(sock)
    assert head.startswith(b"HTTP/1.1 403"), head
    assert b"X-Ctrlrun-Outcome: denied" in head
    assert kube.sessions == []
    assert kube.count(path=path.split("?")[0]) == 0
    [receipt] = receipts(sidecar)
    assert (receipt["action"], receipt["decision"]) == (action, "deny")


def test_websocket_port_forward_is_relayed(allowing: tuple[Sidecar, FakeKubernetes]) -> None:
    import websocket

    sc, kube = allowing
    host, port = sc.kube_base.removeprefix("http://").split(":")
    ws = websocket.create_connection(
        f"ws://{host}:{port}/api/v1/namespaces/default/pods/web-0/portforward?ports=8080",
        header=[f"Authorization: Bearer {KUBE_TOKEN}"],
        subprotocols=["v4.portforward.k8s.io"],
        timeout=10,
    )
    try:
        ws.send_binary(b"\x00tunnel bytes")
        assert ws.recv() == b"\x00tunnel bytes"
    finally:
        ws.close()
    [session] = kube.sessions
    assert (session.kind, session.protocol) == ("portforward", "v4.portforward.k8s.io")
    [receipt] = receipts(sc)
    assert (receipt["action"], receipt["arguments"]["ports"], receipt["result"]) == (
        "k8s.port_forward",
        [8080],
        "committed",
    )


def test_an_exec_the_remote_never_got_is_recorded_failed(
    allowing: tuple[Sidecar, FakeKubernetes],
) -> None:
    sc, kube = allowing
    kube.stop()  # connection refused: nothing can have run
    target = f"{kube.url}{EXEC}?command=ls"
    with raw_upgrade(sc.proxy_url, target, "websocket", "GET") as sock:
        head = read_head(sock)
    assert head.startswith(b"HTTP/1.1 502"), head
    [receipt] = receipts(sc)
    assert (receipt["action"], receipt["result"]) == ("k8s.exec", "failed")
    assert "proxy relay" in receipt["error"]


def test_an_exec_the_remote_refused_is_recorded_failed(
    allowing: tuple[Sidecar, FakeKubernetes],
) -> None:
    sc, kube = allowing
    target = f"{kube.url}/api/v1/namespaces/default/pods/gone/exec?command=ls"
    with raw_upgrade(sc.proxy_url, target, "websocket", "GET") as sock:
        head = read_head(sock)
    assert head.startswith(b"HTTP/1.1 404"), head  # the remote's own answer
    assert kube.sessions == []
    [receipt] = receipts(sc)
    assert (receipt["result"], receipt["error"]) == ("failed", "HTTP 404")


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
@pytest.mark.parametrize(
    ("args", "action"),
    [
        (("attach", "web-0", "-c", "app"), "k8s.attach"),
        (("port-forward", "pod/web-0", ":8080"), "k8s.port_forward"),
    ],
)
def test_kubectl_attach_and_port_forward_denied_reach_nothing(
    sidecar: Sidecar,
    fakes: tuple[FakeStripe, FakeKubernetes],
    tmp_path: Path,
    args: tuple[str, ...],
    action: str,
) -> None:
    _, kube = fakes
    kube.add_pod("default", "web-0")
    done, _ = kubectl(home_for(tmp_path, sidecar.kube_base), *args)
    assert done.returncode != 0
    assert kube.sessions == []
    got = receipts(sidecar)
    assert got and all((r["action"], r["decision"]) == (action, "deny") for r in got)


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_kubectl_attach_allowed_is_relayed(
    allowing: tuple[Sidecar, FakeKubernetes], tmp_path: Path
) -> None:
    sc, kube = allowing
    done, _ = kubectl(home_for(tmp_path, sc.kube_base), "attach", "web-0", "-c", "app")
    assert done.returncode == 0, done.stderr
    assert "ran attach in app" in done.stdout
    assert [(s.kind, s.container) for s in kube.sessions] == [("attach", "app")]
    assert [(r["action"], r["result"]) for r in receipts(sc)] == [("k8s.attach", "committed")]


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_kubectl_exec_that_needs_a_human_runs_once_approved(
    fakes: tuple[FakeStripe, FakeKubernetes], tmp_path: Path
) -> None:
    from test_kubectl import asked

    _, kube = fakes
    kube.add_pod("default", "web-0")
    policy = POLICY.replace("upstreams:\n", "  k8s.exec:\n    decision: approve\nupstreams:\n", 1)
    with running_sidecar(tmp_path / "sc", *fakes, policy_text=policy, in_process=True) as sc:
        home = home_for(tmp_path, sc.kube_base)
        command = ("exec", "web-0", "--", "pg_dump", "shop")
        request_id = asked(kubectl(home, *command)[0])
        assert kube.sessions == []  # asked, and nothing ran
        granted = sc.cli("approve", request_id, "--store-url", sc.store_url)
        assert granted.returncode == 0, granted.stderr

        done, _ = kubectl(home, *command)
        assert done.returncode == 0, done.stderr
        assert [s.command[:2] for s in kube.sessions] == [("pg_dump", "shop")]
        assert receipts(sc)[-1]["result"] == "committed"
