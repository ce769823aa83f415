"""Limits through the real proxy: stalled heads and bodies are closed; approvals are capped.

A slowloris of a bounded number of connections, each sending part of a request head and then
nothing, holds none of them past the configured timeout; a request whose body stalls is
closed and reaches nothing. An agent's pending approval requests stop at the cap: one more
is refused as a full queue, with a receipt, and a resend of one already waiting is not.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Sidecar, fake_remotes, running_sidecar
from rawproxy import plain

from ctrlrun.testing import FakeKubernetes

pytestmark = pytest.mark.timeout(120)

CONNECTIONS = 100
SCALE = "/apis/apps/v1/namespaces/default/deployments/{name}/scale"
MERGE = {"Content-Type": "application/merge-patch+json"}
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  k8s.scale:
    effect: "scale:{{cluster}}:{{deployment}}:{{replicas}}"
    rules:
      - when: {{replicas_lte: 10}}
        decision: allow
      - decision: approve
upstreams:
  cluster:
    profile: kubernetes
    url: {kube}
    cluster: prod-eu
    reconcile: "off"
limits:
  request_head_timeout: 1
  request_body_timeout: 1
  pending_approvals_per_agent: 2
"""


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[Sidecar, FakeKubernetes]]:
    with (
        fake_remotes("a", "b", "c", replicas=1) as (stripe, kube),
        running_sidecar(tmp_path, stripe, kube, policy_text=POLICY, in_process=True) as sc,
    ):
        yield sc, kube


def closed_by_peer(sock: socket.socket, deadline: float) -> bool:
    """Whether the proxy closes ``sock`` before ``deadline`` (monotonic)."""
    while time.monotonic() < deadline:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            if sock.recv(4096) == b"":
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
    return False


def test_a_slowloris_holds_no_connection_past_the_head_timeout(
    rig: tuple[Sidecar, FakeKubernetes],
) -> None:
    sc, kube = rig
    socks = []
    try:
        for _ in range(CONNECTIONS):
            sock = socket.create_connection(("127.0.0.1", sc.proxy_port), timeout=10)
            sock.sendall(f"PATCH http://127.0.0.1:{kube.port}/x HTTP/1.1\r\nHost: a".encode())
            socks.append(sock)
        deadline = time.monotonic() + 20  # the timeout is 1 s; the bound is for a busy host
        held = [s for s in socks if not closed_by_peer(s, deadline)]
        assert held == []
    finally:
        for sock in socks:
            sock.close()
    # The proxy still serves whoever completes a request.
    target = f"http://127.0.0.1:{kube.port}" + SCALE.format(name="a")
    ok = plain(sc.proxy_port, "GET", target, f"127.0.0.1:{kube.port}")
    assert ok.status == 200


def test_a_stalled_body_is_closed_and_reaches_nothing(rig: tuple[Sidecar, FakeKubernetes]) -> None:
    sc, kube = rig
    path = SCALE.format(name="a")
    with socket.create_connection(("127.0.0.1", sc.proxy_port), timeout=10) as sock:
        head = (
            f"PATCH http://127.0.0.1:{kube.port}{path} HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{kube.port}\r\nContent-Type: application/merge-patch+json\r\n"
            "Content-Length: 100\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"spec":')
        assert closed_by_peer(sock, time.monotonic() + 20)
    assert kube.count("PATCH") == 0


def test_pending_approvals_stop_at_the_cap_with_a_receipt(
    rig: tuple[Sidecar, FakeKubernetes],
) -> None:
    sc, kube = rig

    def scale(name: str, replicas: int) -> tuple[int, dict[str, object]]:
        target = f"http://127.0.0.1:{kube.port}" + SCALE.format(name=name)
        body = json.dumps({"spec": {"replicas": replicas}}).encode()
        got = plain(
            sc.proxy_port, "PATCH", target, f"127.0.0.1:{kube.port}", body=body, headers=MERGE
        )
        return got.status, json.loads(got.body).get("ctrlrun", {})

    assert scale("a", 20)[1]["outcome"] == "approval_required"
    assert scale("b", 20)[1]["outcome"] == "approval_required"
    status, full = scale("c", 20)
    assert (status, full["outcome"], full["reason"]) == (403, "denied", "approval_queue_full")
    assert full["receipt_id"]
    # A resend of an action already waiting asks for nothing new: not refused as full.
    assert scale("a", 20)[1]["outcome"] == "approval_required"
    assert scale("a", 5)[0] == 200  # an allowed action is not held back by the queue

    reasons = [r.decision_reason for r in sc.receipts()]
    assert reasons.count("approval_queue_full") == 1
