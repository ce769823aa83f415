"""Kubernetes writes spelt the ways an apiserver (or a proxy in front of it) might read
otherwise than ctrlrun, through a real sidecar to the fake apiserver: each is refused with
ctrlrun's answer and nothing changes; the plain scale still goes through.
"""

from __future__ import annotations

import http.client
import json

import pytest
from harness import KUBE_TOKEN, Sidecar

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(180)
MERGE = "application/merge-patch+json"
DEPLOY = "/apis/apps/v1/namespaces/default/deployments/checkout"


def send(
    base: str, method: str, path: str, headers: list[tuple[str, str]], body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    """One request with the exact path and headers given (http.client normalises neither)."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in [("Authorization", f"Bearer {KUBE_TOKEN}"), *headers]:
            conn.putheader(name, value)
        if body or method in ("PATCH", "PUT", "POST"):
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body or None)
        got = conn.getresponse()
        return got.status, {k.lower(): v for k, v in got.getheaders()}, got.read()
    finally:
        conn.close()


SCALE_TO_50 = b'{"spec":{"replicas":50}}'
ATTACKS: list[tuple[str, str, list[tuple[str, str]], bytes, str]] = [
    # Which of two Content-Types the apiserver reads is not ctrlrun's to guess.
    ("PATCH", f"{DEPLOY}/scale", [("Content-Type", MERGE)] * 2, SCALE_TO_50, "invalid_request"),
    (
        "PATCH",
        f"{DEPLOY}/scale",
        [("Content-Type", f"{MERGE}; charset=utf-16")],
        SCALE_TO_50,
        "invalid_request",
    ),
    ("PATCH", f"{DEPLOY};x/scale", [("Content-Type", MERGE)], SCALE_TO_50, "invalid_request"),
    ("PATCH", f"{DEPLOY}%5Cscale", [("Content-Type", MERGE)], SCALE_TO_50, "invalid_request"),
    (
        "PATCH",
        f"{DEPLOY}/scale",
        [("Content-Type", MERGE), ("X_HTTP_METHOD_OVERRIDE", "GET")],
        SCALE_TO_50,
        "invalid_request",
    ),
    # A GET with a body: a server that does not read it takes it for the next request.
    ("GET", DEPLOY, [("Content-Type", MERGE)], SCALE_TO_50, "invalid_request"),
    # A dry run for ctrlrun, a real delete for an apiserver that reads keys without case.
    (
        "DELETE",
        "/api/v1/namespaces/prod?dryRun=All",
        [("Content-Type", "application/json")],
        b'{"dryRun":["All"],"DRYRUN":[]}',
        "denied",
    ),
]


def test_writes_spelt_otherwise_are_refused_and_change_nothing(
    sidecar: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    kube = fakes[1]
    kube.add_namespace("prod")
    for method, path, headers, body, outcome in ATTACKS:
        status, got, text = send(sidecar.kube_base, method, path, headers, body)
        assert status in (403, 422), (method, path, status, text)
        assert got.get("x-ctrlrun-outcome") == outcome, (method, path, got, text)
        assert "retry-after" not in got and status != 409
        assert json.loads(text)["kind"] == "Status", text
    assert kube.replicas("default", "checkout") == 3
    assert "prod" in kube.namespaces
    six = b'{"spec":{"replicas":6}}'
    status, _, text = send(
        sidecar.kube_base, "PATCH", f"{DEPLOY}/scale", [("Content-Type", MERGE)], six
    )
    assert status == 200, text
    assert kube.replicas("default", "checkout") == 6
