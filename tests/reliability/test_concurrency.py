"""Many sidecars and many SDK processes on one ledger: every effect executes exactly once.

Executions are counted where they happen (at the fake remote, or by the executor appending a
line), never by the ledger under test.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from e2e.harness import Sidecar

from ctrlrun.store import open_store
from ctrlrun.testing import FakeKubernetes, FakeStripe

PROXIES = 4
PROXY_KEYS = 400
CLIENT_THREADS = 16
SDK_PROCESSES = 8
SDK_KEYS = 300
SCALE = "/apis/apps/v1/namespaces/default/deployments/{name}/scale"
MERGE = {"Content-Type": "application/merge-patch+json"}
WORKER = Path(__file__).with_name("sdk_worker.py")
SDK_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  scale:
    effect: "scale:{cluster}:{deployment}:{replicas}"
    decision: allow
"""


def effect_states(url: str) -> Counter[str]:
    store = open_store(url, create=False)
    try:
        with store.reading() as conn:
            from ctrlrun import ledger

            return Counter(ledger.count_effects(conn))
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_four_proxies_on_one_postgres_execute_each_key_once(
    pg_url: str,
    fakes: tuple[FakeStripe, FakeKubernetes],
    sidecars: Callable[..., Sidecar],
    tmp_path: Path,
) -> None:
    stripe, kube = fakes
    names = [f"d{i:03d}" for i in range(PROXY_KEYS)]
    for name in names:
        kube.add_deployment("default", name, replicas=1)
    # Started together on an empty database: the four also race the migration.
    with ThreadPoolExecutor(PROXIES) as pool:
        cars = list(
            pool.map(
                lambda i: sidecars(
                    stripe, kube, workdir=tmp_path / f"p{i}", store_url=pg_url, reconcile="off"
                ),
                range(PROXIES),
            )
        )
    clients = [httpx.Client(base_url=sc.kube_base, timeout=60, trust_env=False) for sc in cars]
    rng = random.Random(7)
    jobs = [(name, p) for name in names for p in rng.sample(range(PROXIES), PROXIES)]

    def send(job: tuple[str, int]) -> str:
        name, p = job
        r = clients[p].patch(
            SCALE.format(name=name), content=b'{"spec":{"replicas":2}}', headers=MERGE
        )
        return (
            str(r.status_code)
            if r.status_code == 200
            else r.headers.get("x-ctrlrun-outcome", str(r.status_code))
        )

    started = time.monotonic()
    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        answers = Counter(pool.map(send, jobs))
    elapsed = time.monotonic() - started
    for c in clients:
        c.close()

    per_deployment = Counter(
        path.split("/")[-2] for method, path in kube.requests if method == "PATCH"
    )
    executions = sum(per_deployment.values())
    duplicates = sum(n - 1 for n in per_deployment.values() if n > 1)
    print(
        f"proxies={PROXIES} keys={PROXY_KEYS} sends={len(jobs)} executions={executions} "
        f"duplicates={duplicates} answers={dict(answers)} seconds={elapsed:.1f}"
    )
    assert duplicates == 0
    assert executions == PROXY_KEYS == kube.writes_applied
    assert all(kube.replicas("default", name) == 2 for name in names)
    assert answers["200"] == PROXY_KEYS
    assert set(answers) <= {"200", "duplicate", "in_progress"}, answers
    assert effect_states(pg_url) == Counter({"committed": PROXY_KEYS})


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_sdk_processes_execute_each_key_once(
    engine: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = (
        f"sqlite:///{tmp_path / 'state.db'}"
        if engine == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    policy = tmp_path / "ctrlrun.yaml"
    policy.write_text(SDK_POLICY)
    runs = tmp_path / "runs.log"
    open_store(url).close()  # the race is over effect keys (tests/store races the migration)
    start_at = time.time() + 2.5
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                url,
                str(policy),
                str(runs),
                str(start_at),
                str(seed),
                str(SDK_KEYS),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(SDK_PROCESSES)
    ]
    outputs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=150)
            assert p.returncode == 0, err[-2000:]
            outputs.append(json.loads(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    lines = runs.read_text().splitlines()
    per_key = Counter(line.split()[0] for line in lines)
    duplicates = sum(n - 1 for n in per_key.values() if n > 1)
    racers = len({line.split()[1] for line in lines})
    print(
        f"engine={engine} processes={SDK_PROCESSES} keys={SDK_KEYS} executions={len(lines)} "
        f"duplicates={duplicates} executing_processes={racers}"
    )
    assert duplicates == 0
    assert len(per_key) == SDK_KEYS == len(lines)
    assert sum(o["ran"] for o in outputs) == SDK_KEYS
    assert sum(o["duplicate"] for o in outputs) == SDK_KEYS * (SDK_PROCESSES - 1)
    assert racers > 1  # the race really was a race
    assert effect_states(url) == Counter({"committed": SDK_KEYS})
