"""One racing process for test_concurrency.py: try every key once; the executor logs each run.

usage: python race_worker.py STORE_URL POLICY_FILE RUNS_FILE START_AT SEED NKEYS
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

import ctrlrun
from ctrlrun import Control, Policy
from ctrlrun.store import open_store


def main() -> None:
    url, policy, runs_file, start_at, seed, nkeys = sys.argv[1:7]
    control = Control(Policy.from_file(policy), open_store(url))
    fd = os.open(runs_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @ctrlrun.protect("refund", control=control)
    def refund(payment_id: str, amount: int) -> None:
        # The executors count themselves: one O_APPEND line per execution, never the ledger.
        os.write(fd, f"{payment_id} {os.getpid()}\n".encode())

    keys = [f"k{i:03d}" for i in range(int(nkeys))]
    random.Random(int(seed)).shuffle(keys)
    counts = {"ran": 0, "duplicate": 0}
    time.sleep(max(0.0, float(start_at) - time.time()))
    with ctrlrun.context(agent=f"racer-{seed}"):
        for key in keys:
            try:
                refund(payment_id=key, amount=100)
                counts["ran"] += 1
            except ctrlrun.DuplicateEffect:
                counts["duplicate"] += 1
    os.close(fd)
    control.store.close()
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
