"""Kubernetes streams and pod writes the apiserver reads as another action than ctrlrun would,
through a real sidecar to the fake apiserver (which reads a stream's options as Go does,
``ctrlrun.testing.kubernetes.routes.go_query``): each is refused and nothing runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness import POLICY, Sidecar, running_sidecar
from test_attacks_kube import send
from test_attacks_kube2 import ALLOW_UNMAPPED
from test_exec import raw_upgrade, read_head, receipts

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(180)
PODS = "/api/v1/namespaces/default/pods"
# No shell, and never the database's container; everything else is allowed.
DENY_LISTS = """\
  k8s.exec:
    rules:
      - when:
          command_eq: [sh]
        decision: deny
      - decision: allow
  k8s.attach:
    rules:
      - when:
          container_eq: db
        decision: deny
      - decision: allow
upstreams:
"""


@pytest.mark.parametrize(
    ("target", "ran"),
    [
        # Go's net/url drops the pair "command=%zz" and reads on: the apiserver runs ["sh"],
        # where Python reads ["%zz", "sh"], a command the policy allows.
        (f"{PODS}/web-0/exec?command=%zz&command=sh", ("exec", ("sh",))),
        # "container=db%zz" is dropped: the apiserver attaches to the pod's only container, db.
        (f"{PODS}/db-0/attach?container=db%zz", ("attach", ())),
    ],
)
@pytest.mark.parametrize("upgrade", ["websocket", "SPDY/3.1"])
def test_a_stream_option_go_drops_for_its_bad_escape_is_refused(
    tmp_path: Path,
    fakes: tuple[FakeStripe, FakeKubernetes],
    target: str,
    ran: tuple[str, tuple[str, ...]],
    upgrade: str,
) -> None:
    stripe, kube = fakes
    kube.add_pod("default", "web-0")
    kube.add_pod("default", "db-0", containers=("db",))
    policy = POLICY.replace("upstreams:\n", DENY_LISTS, 1)
    with running_sidecar(tmp_path, stripe, kube, policy_text=policy, in_process=True) as sidecar:
        with raw_upgrade(sidecar.proxy_url, f"{kube.url}{target}", upgrade, "GET") as sock:
            head = read_head(sock)
        sessions = [(s.kind, s.command) for s in kube.sessions]
        assert head.startswith(b"HTTP/1.1 422"), (head, sessions)
        assert b"X-Ctrlrun-Outcome: invalid_request" in head, head
        assert ran not in sessions and sessions == []
        [receipt] = receipts(sidecar)
        assert (receipt["action"], receipt["result"]) == ("cluster.invalid", "denied"), receipt
        # The same options spelt plainly are decided on what Go reads: denied.
        plain = target.replace("command=%zz&", "").replace("db%zz", "db")
        with raw_upgrade(sidecar.proxy_url, f"{kube.url}{plain}", upgrade, "GET") as sock:
            assert read_head(sock).startswith(b"HTTP/1.1 403")
        assert kube.sessions == []


DEBUGGER = {
    "name": "debugger",
    "image": "busybox:1.36",
    "command": ["sh", "-c", "rm -rf /proc/1/root/data"],
    "targetContainerName": "app",
}


@pytest.mark.parametrize(
    ("method", "content_type", "body"),
    [
        # What kubectl debug sends: a strategic merge patch of the subresource.
        (
            "PATCH",
            "application/strategic-merge-patch+json",
            {"spec": {"ephemeralContainers": [DEBUGGER]}},
        ),
        ("PATCH", "application/merge-patch+json", {"spec": {"ephemeralContainers": [DEBUGGER]}}),
        (
            "PUT",
            "application/json",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "web-0"},
                "spec": {
                    "containers": [{"name": "app", "image": "busybox:1.36"}],
                    "ephemeralContainers": [DEBUGGER],
                },
            },
        ),
    ],
)
def test_an_ephemeral_container_is_refused_under_unmapped_writes_allow(
    tmp_path: Path,
    fakes: tuple[FakeStripe, FakeKubernetes],
    method: str,
    content_type: str,
    body: dict[str, object],
) -> None:
    # An ephemeral container runs its command in the pod at once, beside (and, with a
    # target, inside the process namespace of) the pod's own: an exec by another road,
    # which unmapped_writes: allow would forward undecided.
    stripe, kube = fakes
    kube.add_pod("default", "web-0")
    with running_sidecar(
        tmp_path, stripe, kube, policy_text=ALLOW_UNMAPPED, in_process=True
    ) as sidecar:
        target = f"{PODS}/web-0/ephemeralcontainers"
        headers = [("Content-Type", content_type)]
        status, got, text = send(
            sidecar.kube_base, method, target, headers, json.dumps(body).encode()
        )
        assert got.get("x-ctrlrun-outcome") == "invalid_request", (status, text, kube.sessions)
        assert status == 422 and b"exec" in text, text
        assert kube.sessions == [] and kube.count(method) == 0


@pytest.mark.parametrize(
    ("path", "outcome"),
    [
        # Go's URL.Path decodes each escape and go-restful ignores a trailing '/': both are
        # pods/web-0/exec to the apiserver, so both are decided as k8s.exec (denied here).
        (f"{PODS}/web-0/ex%65c?command=sh", "denied"),
        (f"{PODS}/web-0/exec/?command=sh", "denied"),
        # Spellings servers read differently are refused before any decision.
        (f"{PODS}/web-0%2Fexec?command=sh", "invalid_request"),
        (f"/{PODS}/web-0/exec?command=sh", "invalid_request"),
        (f"{PODS}/web-0/./exec?command=sh", "invalid_request"),
        (f"{PODS}/x/../web-0/exec?command=sh", "invalid_request"),
        (f"{PODS}/web-0/Exec?command=sh", "invalid_request"),  # an upgrade no route maps
    ],
)
def test_an_exec_path_spelt_otherwise_is_decided_or_refused(
    sidecar: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], path: str, outcome: str
) -> None:
    kube = fakes[1]
    kube.add_pod("default", "web-0")
    with raw_upgrade(sidecar.proxy_url, f"{kube.url}{path}", "websocket", "GET") as sock:
        head = read_head(sock)
    assert f"X-Ctrlrun-Outcome: {outcome}".encode() in head, head
    assert kube.sessions == [] and kube.count() == 0
    if outcome == "denied":
        [receipt] = receipts(sidecar)
        assert (receipt["action"], receipt["decision"]) == ("k8s.exec", "deny")
