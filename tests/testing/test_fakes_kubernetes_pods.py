"""The fake apiserver's pods: exec, attach and portforward answered as the apiserver does,
over a WebSocket (the channel protocol) or an SPDY upgrade (an echo), each session counted."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest
import websocket

from ctrlrun.testing import FakeKubernetes

POD = "/api/v1/namespaces/default/pods/web-0"


@pytest.fixture
def kube() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as fake:
        fake.add_pod("default", "web-0", containers=("app", "sidecar"))
        yield fake


def test_a_pod_is_served_as_kubectl_reads_it(kube: FakeKubernetes) -> None:
    pod = httpx.get(f"{kube.url}{POD}").json()
    assert (pod["kind"], pod["status"]["phase"]) == ("Pod", "Running")
    assert [c["name"] for c in pod["spec"]["containers"]] == ["app", "sidecar"]
    assert httpx.get(f"{kube.url}/api/v1/namespaces/default/pods/nope").status_code == 404


@pytest.mark.parametrize(
    ("path", "status", "fragment"),
    [
        (f"{POD}/exec?command=ls&container=app", 400, "Upgrade request required"),
        (f"{POD}/exec?container=app", 400, "at least 1 command"),
        # The apiserver picks a container only when the pod has one (streamLocation).
        (f"{POD}/exec?command=ls", 400, "a container name must be specified"),
        (f"{POD}/exec?command=ls&container=db", 400, "container db is not valid"),
        ("/api/v1/namespaces/default/pods/nope/exec?command=ls", 404, "not found"),
    ],
)
def test_a_connect_the_apiserver_would_refuse(
    kube: FakeKubernetes, path: str, status: int, fragment: str
) -> None:
    got = httpx.post(f"{kube.url}{path}")
    assert got.status_code == status
    assert fragment in got.json()["message"]
    assert kube.sessions == []


def test_websocket_exec_speaks_the_channel_protocol(kube: FakeKubernetes) -> None:
    ws = websocket.create_connection(
        f"ws://127.0.0.1:{kube.port}{POD}/exec?command=echo&command=hi&container=sidecar",
        subprotocols=["v4.channel.k8s.io"],
        timeout=10,
    )
    try:
        assert ws.recv() == b"\x01ran echo hi in sidecar\n"
        error = ws.recv()
        assert error[:1] == b"\x03" and json.loads(error[1:])["status"] == "Success"
    finally:
        ws.close()
    [session] = kube.sessions
    assert (session.kind, session.container, session.command, session.protocol) == (
        "exec",
        "sidecar",
        ("echo", "hi"),
        "v4.channel.k8s.io",
    )


def test_spdy_upgrade_echoes_the_stream(kube: FakeKubernetes) -> None:
    with socket.create_connection(("127.0.0.1", kube.port), timeout=10) as sock:
        sock.sendall(
            f"POST {POD}/attach?container=app HTTP/1.1\r\nHost: k\r\nConnection: Upgrade\r\n"
            "Upgrade: SPDY/3.1\r\nContent-Length: 0\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 101")
        rest = head.split(b"\r\n\r\n", 1)[1]
        sock.sendall(b"frames")
        while len(rest) < len(b"frames"):
            rest += sock.recv(4096)
        assert rest == b"frames"
    assert [(s.kind, s.container) for s in kube.sessions] == [("attach", "app")]


def test_an_ephemeral_container_runs_its_command_when_added(kube: FakeKubernetes) -> None:
    debugger = {"name": "debugger", "image": "busybox", "command": ["sh"], "args": ["-c", "id"]}
    body = {"spec": {"ephemeralContainers": [debugger]}}
    url = f"{kube.url}{POD}/ephemeralcontainers"
    smp = {"Content-Type": "application/strategic-merge-patch+json"}
    dry = httpx.patch(f"{url}?dryRun=All", json=body, headers=smp)
    assert dry.status_code == 200 and kube.sessions == []
    got = httpx.patch(url, json=body, headers=smp)
    assert got.status_code == 200, got.text
    assert [c["name"] for c in got.json()["spec"]["ephemeralContainers"]] == ["debugger"]
    [session] = kube.sessions
    assert (session.kind, session.container, session.command) == (
        "ephemeral",
        "debugger",
        ("sh", "-c", "id"),
    )
    again = httpx.patch(url, json=body, headers=smp)  # already there: nothing new starts
    assert again.status_code == 200 and len(kube.sessions) == 1
    json_patch = {"Content-Type": "application/json-patch+json"}
    assert httpx.patch(url, json=[], headers=json_patch).status_code == 415
