"""The ledger goes away under a running sidecar, then comes back.

Stopping the shared PostgreSQL server would disturb everyone on the machine, so the sidecar
gets its own throwaway database, and the outage is made (and undone) on that database only:
``ALTER DATABASE … ALLOW_CONNECTIONS false`` plus ``pg_terminate_backend`` of its sessions.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest
from e2e.harness import Sidecar

from ctrlrun import ledger
from ctrlrun.store import open_store
from ctrlrun.testing import FakeKubernetes, FakeStripe

from .conftest import pg_admin

DEPLOYMENT = "/apis/apps/v1/namespaces/default/deployments/{name}"
MERGE = {"Content-Type": "application/merge-patch+json"}


@contextmanager
def outage(url: str) -> Iterator[None]:
    name = url.rsplit("/", 1)[1]
    with pg_admin() as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
    try:
        yield
    finally:
        with pg_admin() as admin:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


def scale(client: httpx.Client, name: str, replicas: int = 2) -> httpx.Response:
    return client.patch(
        DEPLOYMENT.format(name=name) + "/scale",
        headers=MERGE,
        content=b'{"spec":{"replicas":%d}}' % replicas,
    )


def outcome(r: httpx.Response) -> str:
    return r.headers.get("x-ctrlrun-outcome", str(r.status_code))


def patches(kube: FakeKubernetes) -> int:
    return kube.count("PATCH")


@pytest.fixture
def running(
    pg_url: str, fakes: tuple[FakeStripe, FakeKubernetes], sidecars: Callable[..., Sidecar]
) -> Iterator[tuple[Sidecar, FakeKubernetes, httpx.Client]]:
    stripe, kube = fakes
    for i in range(12):
        kube.add_deployment("default", f"d{i}", replicas=1)
    sc = sidecars(stripe, kube, store_url=pg_url, reconcile="off", timeout=5)
    with httpx.Client(base_url=sc.kube_base, timeout=30, trust_env=False) as client:
        yield sc, kube, client


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_writes_refused_reads_flow_then_service_resumes(
    pg_url: str, running: tuple[Sidecar, FakeKubernetes, httpx.Client]
) -> None:
    sc, kube, client = running
    assert scale(client, "d0").status_code == 200  # the pool holds live connections now
    forwarded = patches(kube)
    with outage(pg_url):
        refused = Counter(outcome(scale(client, f"d{i}")) for i in range(1, 6))
        statuses = {scale(client, "d1").status_code}
        reads = Counter(client.get(DEPLOYMENT.format(name=f"d{i}")).status_code for i in range(3))
        reads.update([client.get("/apis/apps/v1/namespaces/default/deployments").status_code])
        during = patches(kube) - forwarded
        alive = sc.proc is not None and sc.proc.poll() is None
    restored_at = time.monotonic()
    tries = []
    for i in range(1, 6):  # the same writes again: nothing was reserved during the outage
        r = scale(client, f"d{i}")
        tries.append(outcome(r))
    resumed = time.monotonic() - restored_at
    print(
        f"outage: writes={dict(refused)} forwarded={during} reads={dict(reads)} "
        f"proxy_alive={alive}; after: {tries} in {resumed:.2f}s, no operator action"
    )
    assert refused == Counter({"unavailable": 5})
    assert statuses == {503}
    assert during == 0
    assert reads == Counter({200: 4})
    assert alive
    assert tries == ["200"] * 5
    assert kube.replicas("default", "d5") == 2


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_outage_between_forward_and_record_is_never_lost(
    pg_url: str, running: tuple[Sidecar, FakeKubernetes, httpx.Client]
) -> None:
    """The remote executes, the ledger is gone when the outcome is written: the record stays
    ``executing`` under its lease (ambiguous once the lease runs out), and retries are held."""
    sc, kube, client = running
    assert scale(client, "d0").status_code == 200
    kube.delay_next(2.0)  # the next write is held upstream while the ledger goes away
    with httpx.Client(base_url=sc.kube_base, timeout=30, trust_env=False) as other:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(scale, other, "d7")
            deadline = time.monotonic() + 10
            while (
                time.monotonic() < deadline
                and kube.count("PATCH", DEPLOYMENT.format(name="d7")) == 0
            ):
                time.sleep(0.02)
            with outage(pg_url):
                first = pending.result()
    retry = scale(client, "d7")
    store = open_store(pg_url, create=False)
    try:
        with store.reading() as conn:
            rec = ledger.get_effect(conn, "scale:prod-eu:d7:2")
    finally:
        store.close()
    state = None if rec is None else rec.state.value
    print(
        f"outcome lost with the ledger: agent={first.status_code}/{outcome(first)} "
        f"executed_upstream={kube.replicas('default', 'd7') == 2} record={state} "
        f"retry={outcome(retry)}"
    )
    assert kube.count("PATCH", DEPLOYMENT.format(name="d7")) == 1
    # Not "unavailable" ("nothing was forwarded"): the request did go, and the agent is told so.
    assert first.status_code == 504 and outcome(first) == "upstream_ambiguous"
    assert "could not record" in first.json()["message"]
    assert state in ("executing", "ambiguous")  # held, never lost, never "failed"
    assert outcome(retry) in ("in_progress", "ambiguous")
