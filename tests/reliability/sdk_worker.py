"""One SDK process of test_concurrency.py: try every key once; each execution appends a line.

usage: python sdk_worker.py STORE_URL POLICY_FILE RUNS_FILE START_AT SEED NKEYS
Prints {"ran": N, "duplicate": M} as JSON.
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

    @ctrlrun.protect("scale", control=control)
    def scale(cluster: str, deployment: str, replicas: int) -> None:
        # Counted by the executor itself (one O_APPEND line per run), never by the ledger.
        os.write(fd, f"{deployment} {os.getpid()}\n".encode())

    names = [f"d{i:03d}" for i in range(int(nkeys))]
    random.Random(int(seed)).shuffle(names)
    counts = {"ran": 0, "duplicate": 0}
    time.sleep(max(0.0, float(start_at) - time.time()))
    with ctrlrun.context(agent=f"worker-{seed}"):
        for name in names:
            try:
                scale(cluster="prod", deployment=name, replicas=2)
                counts["ran"] += 1
            except ctrlrun.DuplicateEffect:
                counts["duplicate"] += 1
    os.close(fd)
    control.store.close()
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
