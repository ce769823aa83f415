"""Kubernetes streams and pod writes the apiserver reads as another action than ctrlrun would,
through a real sidecar to the fake apiserver (which reads a stream's options as Go does,
``ctrlrun.testing.kubernetes.routes.go_query``): each is refused and nothing runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import POLICY, start_sidecar
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
    sidecar = start_sidecar(tmp_path, stripe, kube, policy_text=policy, in_process=True)
    try:
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
    finally:
        sidecar.stop()
