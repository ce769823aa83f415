"""One frozen PostgreSQL session must not hold every sidecar: the limits on each session.

A session (a ``psql`` left on ``BEGIN``, a sidecar stopped mid-transaction) takes the
receipt-chain row and holds it for 20 s. Two sidecars on the same ledger keep answering:
within their ``lock_timeout`` each request is either done or refused, and every write that
reached the remote has its record.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from e2e.harness import Sidecar

from ctrlrun import ledger
from ctrlrun.pg_session import TIMEOUTS
from ctrlrun.store import open_store
from ctrlrun.testing import FakeKubernetes, FakeStripe

from .conftest import PG_SERVER

HOLD = 20.0  # seconds the frozen session keeps the chain row
PER_SIDECAR = 3
DEPLOYMENT = "/apis/apps/v1/namespaces/default/deployments/{name}/scale"
MERGE = {"Content-Type": "application/merge-patch+json"}


def seconds(value: str) -> float:
    return float(value.removesuffix("s"))


def hold_chain_row(url: str, held: threading.Event, hold: float) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(f"{PG_SERVER}/{name}", connect_timeout=5) as conn:
        conn.execute("UPDATE receipt_chain SET seq = seq WHERE id = 1")
        held.set()
        time.sleep(hold)  # frozen: idle inside its transaction, the row locked
        conn.rollback()


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_frozen_session_holding_the_chain_row_holds_nobody(
    pg_url: str, fakes: tuple[FakeStripe, FakeKubernetes], sidecars: Callable[..., Sidecar]
) -> None:
    stripe, kube = fakes
    names = [f"d{i}" for i in range(2 * PER_SIDECAR + 2)]
    for name in names:
        kube.add_deployment("default", name, replicas=1)
    fleet = [sidecars(stripe, kube, store_url=pg_url, reconcile="off", timeout=5) for _ in "ab"]
    clients = [httpx.Client(base_url=sc.kube_base, timeout=60, trust_env=False) for sc in fleet]
    for client, name in zip(clients, names[-2:], strict=True):  # warm: pools hold connections
        assert (
            client.patch(
                DEPLOYMENT.format(name=name), headers=MERGE, content=b'{"spec":{"replicas":2}}'
            ).status_code
            == 200
        )

    def scale(i: int) -> tuple[str, float]:
        client = clients[i % 2]
        started = time.monotonic()
        r = client.patch(
            DEPLOYMENT.format(name=names[i]), headers=MERGE, content=b'{"spec":{"replicas":2}}'
        )
        return r.headers.get("x-ctrlrun-outcome", str(r.status_code)), time.monotonic() - started

    held = threading.Event()
    holder = threading.Thread(target=hold_chain_row, args=(pg_url, held, HOLD))
    holder.start()
    assert held.wait(10)
    with ThreadPoolExecutor(2 * PER_SIDECAR) as pool:
        answers = list(pool.map(scale, range(2 * PER_SIDECAR)))
    holder.join(HOLD + 10)
    for client in clients:
        client.close()
    store = open_store(pg_url, create=False)
    try:
        with store.reading() as conn:
            records = {n: ledger.get_effect(conn, f"scale:prod-eu:{n}:2") for n in names}
    finally:
        store.close()
    forwarded = [
        n for n in names[: 2 * PER_SIDECAR] if kube.count("PATCH", DEPLOYMENT.format(name=n))
    ]
    unrecorded = [n for n in forwarded if records[n] is None]
    slowest = max(t for _, t in answers)
    limit = seconds(TIMEOUTS["lock_timeout"])
    states = {n: r and r.state.value for n, r in records.items()}
    print(
        f"chain row held {HOLD:.0f}s: answers={dict(Counter(o for o, _ in answers))} "
        f"slowest={slowest:.1f}s lock_timeout={limit:.0f}s forwarded={len(forwarded)} "
        f"times={[round(t, 1) for _, t in answers]} unrecorded={unrecorded} records={states}"
    )
    assert unrecorded == []
    # Each waited at most one lock_timeout per statement it queued on (reserve, then record),
    # far less than the 20 s the frozen session held the row.
    assert slowest < 2 * limit + 5
