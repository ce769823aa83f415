"""Reconcilers through a running ``ctrlrun proxy``: they only read, they never stall other
flows, and ambiguous leftovers are settled without an agent retrying.

(Reset before apply -> ``not_executed`` -> retry committed is in ``test_kubernetes_e2e.py``.)
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import KUBE_TOKEN, Sidecar, running_sidecar, start_sidecar, time_passes
from sqlalchemy import update

from ctrlrun import clocks
from ctrlrun.action import iso, utc_now
from ctrlrun.schema import effects
from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(90)

SCALE = "/apis/apps/v1/namespaces/default/deployments/{}/scale"
KEY = "scale:prod-eu:checkout:6"
HEADERS = {"Content-Type": "application/merge-patch+json", "Authorization": f"Bearer {KUBE_TOKEN}"}


def patch_scale(sc: Sidecar, replicas: int, name: str = "checkout") -> httpx.Response:
    return httpx.patch(
        sc.kube_base + SCALE.format(name),
        headers=HEADERS,
        timeout=30,
        content=f'{{"spec":{{"replicas":{replicas}}}}}',
        trust_env=False,
    )


def events(sc: Sidecar) -> list[dict[str, Any]]:
    out = sc.cli("receipts", "--json", "--store-url", sc.store_url)
    assert out.returncode == 0, out.stderr
    return [e for e in map(json.loads, out.stdout.splitlines()) if e["kind"] == "event"]


def wait_state(sc: Sidecar, key: str, state: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sc.effect_state(key) == state:
            return
        time.sleep(0.1)
    raise AssertionError(f"{key} is {sc.effect_state(key)}, not {state}")


def test_the_reconciler_only_reads(
    sidecar: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    _, kube = fakes
    kube.fail_next("commit_then_drop")  # applied, then the connection closes: no answer
    seen = len(kube.requests)

    lost = patch_scale(sidecar, 6)

    assert lost.status_code == 504
    assert lost.json()["ctrlrun"]["reason"] == "reconciler: committed"
    assert sidecar.effect_state(KEY) == "committed"
    asked = kube.requests[seen:]
    assert asked[0] == ("PATCH", SCALE.format("checkout"))
    assert asked[1:] and {method for method, _ in asked[1:]} == {"GET"}
    assert kube.writes_applied == 1  # the agent's write, and nothing from the reconciler
    assert patch_scale(sidecar, 6).status_code == 403  # settled committed: a duplicate
    assert kube.writes_applied == 1


def test_a_hung_reconciler_stalls_no_other_flow_and_ends_unknown(
    sidecar: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    _, kube = fakes
    kube.add_deployment(namespace="default", name="web", replicas=2)
    stuck_path = SCALE.format("checkout")
    kube.fail_next("reset_before", path=stuck_path)
    kube.fail_reads("hang", times=1, path=stuck_path)  # the reconciler's GET never answers
    result: dict[str, Any] = {}

    def stuck() -> None:
        started = time.monotonic()
        result["response"] = patch_scale(sidecar, 6)
        result["elapsed"] = time.monotonic() - started

    agent = threading.Thread(target=stuck, daemon=True)
    agent.start()
    deadline = time.monotonic() + 10
    while kube.count("GET", stuck_path) == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert kube.count("GET", stuck_path) == 1, "the reconciler never asked"

    # While that request waits for its reconciler, others go through at full speed.
    started = time.monotonic()
    assert patch_scale(sidecar, 4, "web").status_code == 200
    read = httpx.get(
        sidecar.kube_base + "/apis/apps/v1/namespaces/default/deployments/web",
        headers=HEADERS,
        timeout=10,
        trust_env=False,
    )
    assert read.status_code == 200 and read.json()["spec"]["replicas"] == 4
    assert time.monotonic() - started < 3
    assert agent.is_alive()

    agent.join(30)
    assert not agent.is_alive()
    response = result["response"]
    assert response.status_code == 504
    assert response.json()["ctrlrun"]["reason"] == "reconciler: unknown"
    assert 3 < result["elapsed"] < 15  # bounded by the reconciler's deadline, not the hang
    assert sidecar.effect_state(KEY) == "ambiguous"  # unknown moves nothing
    resolved = [e for e in events(sidecar) if e["type"] == "RECONCILIATION_RESOLVED"]
    assert [(e["effect_key"], e["data"]["outcome"]) for e in resolved] == [(KEY, "unknown")]


def test_the_sweep_settles_an_ambiguous_effect_without_a_retry(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    stripe, kube = fakes
    with running_sidecar(
        tmp_path, stripe, kube, reconcile="lazy", sweep_interval=1, in_process=True
    ) as sc:
        kube.fail_next("commit_then_drop")
        lost = patch_scale(sc, 6)
        assert lost.status_code == 504
        assert lost.json()["ctrlrun"]["reason"] == "reconciler: not asked"  # lazy: no eager call

        wait_state(sc, KEY, "committed")
    assert kube.count("PATCH") == 1  # nobody retried
    assert kube.writes_applied == 1
    swept = [
        (e["type"], e["data"].get("trigger") or e["data"].get("outcome"))
        for e in events(sc)
        if e["effect_key"] == KEY
    ]
    assert swept[:2] == [
        ("RECONCILIATION_STARTED", "sweep"),
        ("RECONCILIATION_RESOLVED", "committed"),
    ]


def test_ctrlrun_reconcile_settles_ambiguous_effects_both_ways(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes], monkeypatch: pytest.MonkeyPatch
) -> None:
    stripe, kube = fakes
    kube.add_deployment(namespace="default", name="web", replicas=2)
    with running_sidecar(
        tmp_path, stripe, kube, reconcile="lazy", sweep_interval=0, in_process=True
    ) as sc:
        kube.fail_next("commit_then_drop")
        assert patch_scale(sc, 6).status_code == 504
        kube.fail_next("reset_before")
        assert patch_scale(sc, 5, "web").status_code == 504
        assert sc.effect_state(KEY) == sc.effect_state("scale:prod-eu:web:5") == "ambiguous"
        writes = kube.writes_applied

        one = sc.cli("reconcile", KEY, "--policy", str(sc.policy), "--store-url", sc.store_url)
        assert one.returncode == 0, one.stderr
        assert one.stdout.split() == [KEY, "committed"]
        # Inside the write's settle window "replicas is still 2" proves nothing ...
        inside = sc.cli("reconcile", "--policy", str(sc.policy), "--store-url", sc.store_url)
        assert inside.stdout.split() == ["scale:prod-eu:web:5", "unknown"]
        # A step of the wall clock alone (NTP) is not the window going by: still unknown ...
        monkeypatch.setattr(clocks, "_offset", lambda: timedelta(minutes=2))
        stepped = sc.cli("reconcile", "--policy", str(sc.policy), "--store-url", sc.store_url)
        assert stepped.stdout.split() == ["scale:prod-eu:web:5", "unknown"]
        # ... once it is over (this process's clock, the ledger's, two minutes on), it does.
        time_passes(monkeypatch, 120)
        every = sc.cli("reconcile", "--policy", str(sc.policy), "--store-url", sc.store_url)
        assert every.returncode == 0, every.stderr
        assert every.stdout.split() == ["scale:prod-eu:web:5", "not_executed"]

        assert sc.effect_state(KEY) == "committed"
        assert sc.effect_state("scale:prod-eu:web:5") == "failed"
        assert kube.writes_applied == writes
        assert patch_scale(sc, 5, "web").status_code == 200  # failed: a retry may run
        assert patch_scale(sc, 6).status_code == 403  # committed: a duplicate


def killed_mid_request(
    tmp_path: Path, stripe: FakeStripe, kube: FakeKubernetes, *, sweep_interval: float
) -> Sidecar:
    """Kill ``ctrlrun proxy`` (SIGKILL) while its write hangs upstream; return a restarted
    proxy (in this process: only the kill needs the real command)."""
    first = start_sidecar(tmp_path, stripe, kube)
    kube.fail_next("hang")
    agent = threading.Thread(target=lambda: _swallow(patch_scale, first, 6), daemon=True)
    agent.start()
    deadline = time.monotonic() + 10
    while kube.count("PATCH") == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert kube.count("PATCH") == 1
    first.stop(signal.SIGKILL)
    agent.join(30)
    assert first.effect_state(KEY) == "executing"  # the crash's leftover, lease still live
    return start_sidecar(tmp_path, stripe, kube, sweep_interval=sweep_interval, in_process=True)


def _swallow(fn: Any, *args: Any) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the proxy died under it: a broken connection
        fn(*args)


def expire_lease(sc: Sidecar, key: str) -> None:
    """Time travel: the lease (timeout + reconcile deadline + 60 s) has run out, so the attempt
    started longer ago than that (its settle window, timeout + 60 s, is over too)."""
    store = sc.store()
    try:
        with store.transaction() as conn:
            conn.execute(
                update(effects)
                .where(effects.c.effect_key == key)
                .values(
                    lease_expires_at=iso(utc_now() - timedelta(seconds=1)),
                    attempt_started_at=iso(utc_now() - timedelta(seconds=76)),
                )
            )
    finally:
        store.close()


def test_a_killed_proxys_leftover_is_reconciled_once_its_lease_expires(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    stripe, kube = fakes
    # No sweep here: the reconciliation below must be the retry's own.
    sc = killed_mid_request(tmp_path, stripe, kube, sweep_interval=0)
    try:
        live = patch_scale(sc, 6)
        assert live.status_code == 403  # a live lease: never take a request that may be running
        assert live.headers["X-Ctrlrun-Outcome"] == "in_progress"

        expire_lease(sc, KEY)
        # The next attempt ambiguates the record, asks the reconciler (the hung write was never
        # applied: not_executed), and is forwarded as attempt 2.
        assert patch_scale(sc, 6).status_code == 200
        assert sc.effect_state(KEY) == "committed"
        assert kube.replicas("default", "checkout") == 6
        assert kube.writes_applied == 1
    finally:
        sc.stop()
    resolved = [e["data"]["outcome"] for e in events(sc) if e["type"] == "RECONCILIATION_RESOLVED"]
    assert resolved == ["not_executed"]


def test_a_killed_proxys_leftover_is_swept_without_a_retry(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    stripe, kube = fakes
    sc = killed_mid_request(tmp_path, stripe, kube, sweep_interval=1)
    try:
        expire_lease(sc, KEY)
        every = sc.cli("reconcile", "--policy", str(sc.policy), "--store-url", sc.store_url)
        assert every.returncode == 0, every.stderr
        assert sc.effect_state(KEY) == "failed"  # the hung write was never applied
        assert kube.count("PATCH") == 1
    finally:
        sc.stop()
