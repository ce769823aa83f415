"""Eight OS processes race over the same 200 effect keys: each key executes exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from ctrlrun import EffectState
from ctrlrun import ledger as L
from ctrlrun.store import open_store

PROCESSES = 8
KEYS = 200
WORKER = Path(__file__).with_name("race_worker.py")


def race(store_url: str, policy_file: Path, tmp_path: Path) -> None:
    runs_file = tmp_path / "runs.log"
    # Create the ledger first so the race is over effect keys, not over the migration
    # (test_store.py races the migration on its own).
    open_store(store_url).close()
    start_at = time.time() + 2.0
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                store_url,
                str(policy_file),
                str(runs_file),
                str(start_at),
                str(seed),
                str(KEYS),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(PROCESSES)
    ]
    outputs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            outputs.append(json.loads(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    lines = runs_file.read_text().splitlines()
    per_key = Counter(line.split()[0] for line in lines)
    assert len(per_key) == KEYS
    assert set(per_key.values()) == {1}, [k for k, n in per_key.items() if n != 1]
    assert sum(o["ran"] for o in outputs) == KEYS
    assert sum(o["duplicate"] for o in outputs) == KEYS * (PROCESSES - 1)
    assert len({line.split()[1] for line in lines}) > 1  # the race really was a race

    store = open_store(store_url, create=False)
    try:
        with store.reading() as conn:
            records = L.list_effects(conn)
            head_seq, _ = L.chain_head(conn)
        assert len(records) == KEYS
        assert {r.state for r in records} == {EffectState.COMMITTED}
        assert {r.attempt for r in records} == {1}
        assert head_seq == KEYS * PROCESSES  # one receipt per call, none lost
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_processes_race_on_sqlite(policy_file: Path, tmp_path: Path) -> None:
    race(f"sqlite:///{tmp_path / 'race' / 'state.db'}", policy_file, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_processes_race_on_postgres(pg_url: str, policy_file: Path, tmp_path: Path) -> None:
    race(pg_url, policy_file, tmp_path)
