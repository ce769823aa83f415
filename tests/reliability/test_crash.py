"""SIGKILL the sidecar while it forwards protected writes; restart it; the agent retries.

Five lanes run side by side, each a ``ctrlrun proxy`` in front of one fake apiserver, on its
own SQLite ledger or all on one PostgreSQL database (25 kills on each engine, 50 in all). A
trial restarts the lane's proxy, sends the writes the agent saw fail last time plus four new
ones, and kills the proxy at a random moment, blind or just after a write reached the fake
(which holds writes for a while, to widen the window between "sent upstream" and
"recorded"). A last pass restarts every proxy and re-sends every key ever sent. Then,
counted at the fake: no deployment was scaled twice, and every scale that happened has a
record that says so.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from e2e.harness import Sidecar

from ctrlrun import ledger
from ctrlrun.store import open_store
from ctrlrun.testing import FakeKubernetes, FakeStripe

LANES = 5
TRIALS_PER_LANE = 5  # 25 kills per engine, 50 in all
NEW_PER_TRIAL = 4
SCALE = "/apis/apps/v1/namespaces/default/deployments/{name}/scale"
MERGE = {"Content-Type": "application/merge-patch+json"}


def send(client: httpx.Client, name: str) -> str:
    try:
        r = client.patch(SCALE.format(name=name), content=b'{"spec":{"replicas":2}}', headers=MERGE)
    except httpx.HTTPError:
        return "error"  # the proxy died under the request: the agent will retry it
    return "200" if r.status_code == 200 else r.headers.get("x-ctrlrun-outcome", str(r.status_code))


def wait_until_upstream(kube: FakeKubernetes, batch: list[str], limit: float = 5.0) -> None:
    paths = {SCALE.format(name=name) for name in batch}
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and not any(p in paths for _, p in kube.requests):
        time.sleep(0.01)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_sigkill_while_forwarding_never_duplicates_nor_loses(
    engine: str,
    request: pytest.FixtureRequest,
    fakes: tuple[FakeStripe, FakeKubernetes],
    sidecars: Callable[..., Sidecar],
    tmp_path: Path,
) -> None:
    stripe, kube = fakes
    shared = request.getfixturevalue("pg_url") if engine == "postgresql" else None
    names = {
        lane: [f"l{lane}t{t}k{j}" for t in range(TRIALS_PER_LANE) for j in range(NEW_PER_TRIAL)]
        for lane in range(LANES)
    }
    for lane_names in names.values():
        for name in lane_names:
            kube.add_deployment("default", name, replicas=1)
    answers: Counter[str] = Counter()
    lock = threading.Lock()

    def lane(idx: int) -> None:
        rng = random.Random(f"{engine}{idx}")
        workdir = tmp_path / f"lane{idx}"
        retry: list[str] = []
        for t in range(TRIALS_PER_LANE):
            sc = sidecars(stripe, kube, workdir=workdir, reconcile="off", store_url=shared)
            batch = retry + names[idx][t * NEW_PER_TRIAL : (t + 1) * NEW_PER_TRIAL]
            rng.shuffle(batch)
            for _ in batch:
                kube.delay_next(rng.uniform(0.02, 0.3))
            with (
                httpx.Client(base_url=sc.kube_base, timeout=10, trust_env=False) as client,
                ThreadPoolExecutor(len(batch)) as pool,
            ):
                futures = {name: pool.submit(send, client, name) for name in batch}
                if t % 2:  # blind: anywhere from accepting the request to answering it
                    time.sleep(rng.uniform(0.0, 0.5))
                else:  # aimed: once a write is upstream, before (or just after) it is recorded
                    wait_until_upstream(kube, batch)
                    time.sleep(rng.uniform(0.0, 0.2))
                sc.stop(signal.SIGKILL)
                got = {name: f.result() for name, f in futures.items()}
            retry = [name for name, answer in got.items() if answer == "error"]
            with lock:
                answers.update(got.values())

    started = time.monotonic()
    with ThreadPoolExecutor(LANES) as pool:
        list(pool.map(lane, range(LANES)))

    # Restart every lane and re-send every key it ever sent: a retry must never run twice.
    def final(idx: int) -> dict[str, str | None]:
        sc = sidecars(
            stripe, kube, workdir=tmp_path / f"lane{idx}", reconcile="off", store_url=shared
        )
        with (
            httpx.Client(base_url=sc.kube_base, timeout=30, trust_env=False) as client,
            ThreadPoolExecutor(8) as pool,
        ):
            again = Counter(pool.map(lambda n: send(client, n), names[idx]))
        with lock:
            answers.update(f"final:{a}" for a in again.elements())
        store = open_store(sc.store_url, create=False)
        try:
            with store.reading() as conn:
                records = {n: ledger.get_effect(conn, f"scale:prod-eu:{n}:2") for n in names[idx]}
        finally:
            store.close()
        sc.stop(signal.SIGKILL)
        return {n: None if r is None else r.state.value for n, r in records.items()}

    with ThreadPoolExecutor(LANES) as pool:
        states = {
            n: s for lane_states in pool.map(final, range(LANES)) for n, s in lane_states.items()
        }
    elapsed = time.monotonic() - started

    executed = Counter(path.split("/")[-2] for method, path in kube.requests if method == "PATCH")
    duplicates = sorted(n for n, c in executed.items() if c > 1)
    lost = sorted(
        n for n in executed if states.get(n) not in ("committed", "ambiguous", "executing")
    )
    by_state = Counter(states[n] for n in executed)
    not_sent = Counter(str(states[n]) for n in states if n not in executed)
    print(
        f"engine={engine} trials={LANES * TRIALS_PER_LANE} keys={len(states)} "
        f"executed={sum(executed.values())} "
        f"duplicates={len(duplicates)} lost={len(lost)} "
        f"committed={by_state['committed']} ambiguous={by_state['ambiguous']} "
        f"executing_with_live_lease={by_state['executing']} (ambiguous-in-waiting: becomes "
        f"ambiguous when its lease expires) reserved_but_never_sent={dict(not_sent)} "
        f"answers={dict(answers)} seconds={elapsed:.1f}"
    )
    assert not duplicates, duplicates
    assert not lost, {n: states.get(n) for n in lost}
    # Every key was either executed once or is held by a record that blocks a blind retry.
    assert all(states[n] in ("executing", "ambiguous") for n in states if n not in executed)
    assert by_state["executing"] + by_state["ambiguous"] > 0, "no kill landed mid-forward"
