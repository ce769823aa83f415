"""``Connection: upgrade`` with no ``Upgrade`` header, through a real sidecar to the fake
apiserver: Go's apiserver reads the first alone as an upgrade of ``pods/exec`` and hands the
connection on to the kubelet, so it is refused, never passed on as the read it looks like."""

from __future__ import annotations

import pytest
from harness import Sidecar
from test_attacks_kube import send

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(120)
DEPLOY = "/apis/apps/v1/namespaces/default/deployments/checkout"
EXEC = "/api/v1/namespaces/default/pods/web-0/exec?command=sh&stdout=1"


@pytest.mark.parametrize(
    "headers",
    [
        [("Connection", "Upgrade")],
        [("Connection", "keep-alive, upgrade")],
        [("Connection", "keep-alive"), ("Connection", "Upgrade")],
    ],
)
def test_a_get_to_exec_saying_connection_upgrade_alone_is_refused(
    sidecar: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], headers: list[tuple[str, str]]
) -> None:
    _, kube = fakes
    kube.add_pod("default", "web-0")
    status, got, _ = send(sidecar.kube_base, "GET", EXEC, headers)
    assert (status, got.get("x-ctrlrun-outcome")) == (422, "invalid_request"), (status, got)
    assert kube.sessions == []
    # The same read without it is a read (the apiserver answers it: no upgrade, no stream).
    status, got, _ = send(sidecar.kube_base, "GET", DEPLOY, [("Connection", "keep-alive")])
    assert status == 200 and "x-ctrlrun-outcome" not in got, (status, got)
