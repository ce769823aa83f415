"""Kubernetes writes whose request target the apiserver (Go) reads otherwise than ctrlrun
(Python), through a real sidecar to the fake apiserver, which reads a query as Go does
(``ctrlrun.testing.kubernetes.routes.go_query``): each is refused and changes nothing.
"""

from __future__ import annotations

import json

import pytest
from harness import Sidecar
from test_attacks_kube import MERGE, send

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(180)
SCALE = "/apis/apps/v1/namespaces/default/deployments/checkout/scale"
SCALE_TO_50 = b'{"spec":{"replicas":50}}'


def refused(sidecar: Sidecar, kube: FakeKubernetes, target: str) -> None:
    status, got, text = send(
        sidecar.kube_base, "PATCH", target, [("Content-Type", MERGE)], SCALE_TO_50
    )
    assert got.get("x-ctrlrun-outcome") == "invalid_request", (target[:80], status, text)
    assert status == 422 and json.loads(text)["kind"] == "Status", text
    assert kube.replicas("default", "checkout") == 3
    assert kube.count("PATCH") == 0  # not even ctrlrun's own dry run was sent


@pytest.mark.parametrize(
    "query",
    [
        # Python ends the query at '#' and reads dryRun=All; Go keeps "All#;" in the pair,
        # drops the pair for its ';' and applies the patch.
        "?dryRun=All#;",
        "?dryRun=All#%zz",  # Go drops the pair for its bad escape
    ],
)
def test_a_dry_run_cut_short_by_a_hash_is_refused(
    sidecar: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], query: str
) -> None:
    refused(sidecar, fakes[1], SCALE + query)
