"""One ``bench_ledger.py`` worker: ``@protect`` calls on a store it is told to open.

The same JSON-line protocol, ops and timing code as ``_protect_worker.py`` (its ``Bench``
methods are reused), with two differences: the store is named by a first ``open`` command (a
filled SQLite file, or a PostgreSQL database for either distribution's ``PostgresStateStore``),
and each call's effect key is ``w:{n}`` with ``n`` a random 62-bit number, so new keys land all
over the effect-key index of a filled ledger instead of next to each other. Standard library
only: it also runs in the reference venv.

    {"op": "open", "store": {"kind": "sqlite", "path": P} | {"kind": "postgres", "url": U},
     "seed": S}                                       -> {"ready": {...info...}}
    {"op": "sync",    "calls": N, "max_seconds": S}  -> {"calls": n, "seconds": t, "cpu_seconds": c}
    {"op": "profile", "calls": N, "top": K}          -> {"cumulative": "...", "tottime": "..."}
    {"op": "quit"}
"""

from __future__ import annotations

import importlib
import json
import os
import random
import sys
import tempfile
import traceback
from typing import Any

# Run with ``python -I``: the script's own directory is not on sys.path unless put there.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _protect_worker as pw  # (it also moves library output to stderr)


def _write(n: int) -> int:
    return n


class LedgerBench(pw.Bench):
    """``_protect_worker.Bench`` on a given store, handing out random keys."""

    def __init__(self, workdir: str, store: dict[str, Any], seed: int) -> None:
        ctrlrun: Any = importlib.import_module("ctrlrun")
        self.ctrlrun = ctrlrun
        policy_path = os.path.join(workdir, "ctrlrun.yaml")
        with open(policy_path, "w", encoding="utf-8") as fh:
            fh.write(pw.POLICY)
        self.store = pw.open_store(ctrlrun, store)
        self.kind = store["kind"]
        self.control = ctrlrun.Control(ctrlrun.Policy.from_file(policy_path), self.store)
        self.write: Any = ctrlrun.protect("bench.write", effect="w:{n}", control=self.control)(
            _write
        )
        self.async_write, self.async_refusal = None, None
        self.rng = random.Random(seed)

    def fresh(self) -> int:
        return self.rng.getrandbits(62)


def main() -> int:
    bench: LedgerBench | None = None
    with tempfile.TemporaryDirectory(prefix="ctrlrun-bench-ledger-") as workdir:
        pw.reply({"ready": {"python": sys.version.split()[0]}})
        for line in sys.stdin:
            cmd = json.loads(line)
            op = cmd.get("op")
            try:
                if op == "quit":
                    pw.reply({"bye": True})
                    break
                if op == "open":
                    bench = LedgerBench(workdir, cmd["store"], int(cmd["seed"]))
                    pw.reply({"ready": bench.info()})
                elif bench is None:
                    pw.reply({"error": f"{op!r} before open"})
                elif op == "sync":
                    pw.reply(bench.sync(int(cmd["calls"]), float(cmd["max_seconds"])))
                elif op == "profile":
                    pw.reply(bench.profile(int(cmd["calls"]), int(cmd.get("top", 25))))
                else:
                    pw.reply({"error": f"unknown op {op!r}"})
            except Exception:
                pw.reply({"error": traceback.format_exc(limit=6)})
        if bench is not None:
            bench.store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
