"""Fail closed: a protected write that meets a broken ledger is refused, never forwarded;
reads keep flowing.

This runs the proxy (in this process) on a throwaway PostgreSQL database and then stops that
database from accepting connections (and ends the ones it has), so every store call really
fails.
Internal errors, one collaborator at a time, are in ``tests/proxy/test_addon.py``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import KUBE_TOKEN, STRIPE_KEY, start_sidecar

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(90)

PG_SERVER = "postgresql://postgres@127.0.0.1:5432"
DEPLOYMENT = "/apis/apps/v1/namespaces/default/deployments/checkout"
SCALE = DEPLOYMENT + "/scale"
KUBE_HEADERS = {
    "Content-Type": "application/merge-patch+json",
    "Authorization": f"Bearer {KUBE_TOKEN}",
}


# -- end to end: the ledger goes away under a running proxy ---------------------------------


class Database:
    """A throwaway PostgreSQL database that can be cut off and brought back."""

    def __init__(self, admin: Any, name: str) -> None:
        self.admin, self.name = admin, name
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"

    def cut(self) -> None:
        """No new connections, and the open ones are ended: every store call now fails."""
        self.admin.execute(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS false')
        self.admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (self.name,),
        )

    def restore(self) -> None:
        self.admin.execute(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true')


@pytest.fixture
def database() -> Iterator[Database]:
    psycopg = pytest.importorskip("psycopg")
    try:
        admin = psycopg.connect(f"{PG_SERVER}/test", autocommit=True, connect_timeout=3)
    except psycopg.Error as exc:
        pytest.skip(f"no PostgreSQL at {PG_SERVER}: {exc}")
    db = Database(admin, f"ctrlrun_e2e_{uuid.uuid4().hex[:12]}")
    admin.execute(f'CREATE DATABASE "{db.name}"')
    try:
        yield db
    finally:
        db.restore()
        admin.execute(f'DROP DATABASE IF EXISTS "{db.name}" WITH (FORCE)')
        admin.close()


def wait_status(url: str, status: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        got = httpx.get(url, timeout=10, trust_env=False).status_code
        if got == status:
            return
        time.sleep(0.1)
    raise AssertionError(f"{url}: {got}, expected {status}")


def test_store_down_refuses_writes_unforwarded_and_reads_still_pass(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes], database: Database
) -> None:
    stripe, kube = fakes
    pi = stripe.add_payment_intent(amount=5000)
    sc = start_sidecar(tmp_path, stripe, kube, admin=True, store_url=database.url, in_process=True)
    kube_client = httpx.Client(base_url=sc.kube_base, timeout=30, trust_env=False)
    try:
        with kube_client:
            first = kube_client.patch(
                SCALE, content=b'{"spec":{"replicas":6}}', headers=KUBE_HEADERS
            )
            assert first.status_code == 200, first.text
            wait_status(sc.admin_url + "/readyz", 200)

            database.cut()
            wait_status(sc.admin_url + "/readyz", 503)
            patches, posts = kube.count("PATCH"), stripe.count("POST")

            started = time.monotonic()
            refused = kube_client.patch(
                SCALE, content=b'{"spec":{"replicas":7}}', headers=KUBE_HEADERS
            )
            assert time.monotonic() - started < 15
            assert refused.status_code == 503
            assert refused.headers["X-Ctrlrun-Outcome"] == "unavailable"
            assert refused.json()["kind"] == "Status"
            assert refused.json()["message"].startswith("ctrlrun:")
            assert refused.json()["ctrlrun"]["reason"] == "store_unavailable"
            refund = httpx.post(
                sc.stripe_base + "/v1/refunds",
                data={"payment_intent": pi["id"], "amount": "1000"},
                headers={"Authorization": f"Bearer {STRIPE_KEY}"},
                timeout=30,
                trust_env=False,
            )
            assert refund.status_code == 503
            assert refund.headers["X-Ctrlrun-Outcome"] == "unavailable"
            assert refund.json()["error"]["code"] == "ctrlrun_unavailable"
            # Nothing reached either remote.
            assert (kube.count("PATCH"), stripe.count("POST")) == (patches, posts)
            assert kube.replicas("default", "checkout") == 6

            read = kube_client.get(DEPLOYMENT, headers={"Authorization": f"Bearer {KUBE_TOKEN}"})
            assert read.status_code == 200
            assert read.json()["spec"]["replicas"] == 6

            database.restore()
            wait_status(sc.admin_url + "/readyz", 200)
            again = kube_client.patch(
                SCALE, content=b'{"spec":{"replicas":7}}', headers=KUBE_HEADERS
            )
            assert again.status_code == 200, again.text
            assert kube.replicas("default", "checkout") == 7
    finally:
        sc.stop()
    effects = sc.cli("effects", "--json", "--store-url", database.url)
    states = {
        json.loads(line)["effect_key"]: json.loads(line)["state"]
        for line in effects.stdout.splitlines()
    }
    assert states == {
        "scale:prod-eu:checkout:6": "committed",
        "scale:prod-eu:checkout:7": "committed",
    }
