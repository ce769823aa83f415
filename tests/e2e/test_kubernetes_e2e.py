"""The official ``kubernetes`` Python client scaling a deployment through ``ctrlrun proxy``."""

from __future__ import annotations

import json
from typing import Any

import kubernetes.client
import pytest
from harness import KUBE_TOKEN, Sidecar, time_passes
from kubernetes.client.rest import ApiException

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(90)

SCALE = "/apis/apps/v1/namespaces/default/deployments/checkout/scale"
KEY = "scale:prod-eu:checkout:6"


def apps_api(base: str) -> kubernetes.client.AppsV1Api:
    """An AppsV1Api on ``base`` with a bearer token, as an agent would configure it."""
    cfg = kubernetes.client.Configuration(
        host=base,
        api_key={"authorization": KUBE_TOKEN},
        api_key_prefix={"authorization": "Bearer"},
    )
    cfg.proxy = None  # talk to the reverse listener directly, whatever the environment says
    return kubernetes.client.AppsV1Api(kubernetes.client.ApiClient(cfg))


def scale(api: kubernetes.client.AppsV1Api, replicas: int, name: str = "checkout") -> Any:
    return api.patch_namespaced_deployment_scale(
        name, "default", {"spec": {"replicas": replicas}}, _request_timeout=30
    )


def refused(api: kubernetes.client.AppsV1Api, replicas: int) -> ApiException:
    with pytest.raises(ApiException) as err:
        scale(api, replicas)
    return err.value


def ledger_json(sc: Sidecar, *args: str) -> list[dict[str, Any]]:
    out = sc.cli(*args, "--json", "--store-url", sc.store_url)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_scale_commits_and_an_identical_scale_is_refused(
    sidecar: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    _, kube = fakes
    api = apps_api(sidecar.kube_base)

    assert scale(api, 6).spec.replicas == 6
    assert kube.replicas("default", "checkout") == 6
    assert sidecar.effect_state(KEY) == "committed"

    exc = refused(api, 6)
    assert exc.status == 403
    assert "ctrlrun:" in exc.body
    assert exc.headers["X-Ctrlrun-Outcome"] == "duplicate"
    body = json.loads(exc.body)
    assert (body["kind"], body["code"]) == ("Status", 403)
    assert body["ctrlrun"]["effect_key"] == KEY
    assert kube.count("PATCH") == 1
    assert kube.writes_applied == 1


def test_reset_before_apply_is_reconciled_not_executed_and_the_retry_commits(
    sidecar: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, kube = fakes
    api = apps_api(sidecar.kube_base)
    kube.fail_next("reset_before")
    seen = len(kube.requests)

    exc = refused(api, 6)

    # The reconciler answered within the same call: the agent's 504 says what it found. The
    # write may still be in flight at the apiserver (its settle window): nothing is proven.
    assert exc.status == 504
    assert exc.headers["X-Ctrlrun-Outcome"] == "upstream_ambiguous"
    block = json.loads(exc.body)["ctrlrun"]
    assert block["reason"] == "reconciler: unknown"
    assert sidecar.effect_state(KEY) == "ambiguous"
    # The reconciler only read: one forwarded PATCH (reset), then GETs, nothing applied.
    after = kube.requests[seen:]
    assert after[0] == ("PATCH", SCALE)
    assert after[1:] and all(method == "GET" for method, _ in after[1:])
    assert kube.writes_applied == 0
    assert kube.replicas("default", "checkout") == 3
    assert refused(api, 6).headers["X-Ctrlrun-Outcome"] == "ambiguous"  # a retry, too early

    # Two minutes on (this process's clock is the ledger's), the window is over: the next
    # retry's own reconciliation finds replicas still 3, and the renewal is forwarded.
    time_passes(monkeypatch, 120)
    assert scale(api, 6).spec.replicas == 6
    assert sidecar.effect_state(KEY) == "committed"
    assert kube.writes_applied == 1

    lines = ledger_json(sidecar, "receipts")
    events = [e for e in lines if e["kind"] == "event" and e["type"].startswith("RECONCILIATION")]
    assert [(e["type"], e["data"].get("trigger") or e["data"]["outcome"]) for e in events] == [
        ("RECONCILIATION_STARTED", "eager"),
        ("RECONCILIATION_RESOLVED", "unknown"),
        ("RECONCILIATION_STARTED", "blocking"),
        ("RECONCILIATION_RESOLVED", "unknown"),
        ("RECONCILIATION_STARTED", "blocking"),
        ("RECONCILIATION_RESOLVED", "not_executed"),
    ]
    results = [r["result"] for r in ledger_json(sidecar, "receipts") if r["kind"] == "receipt"]
    assert results == ["ambiguous", "blocked", "committed"]
    text = sidecar.cli("receipts", "--store-url", sidecar.store_url).stdout
    assert f"RECONCILIATION_STARTED  {KEY}" in text
    assert f"RECONCILIATION_RESOLVED  {KEY}  not_executed" in text
