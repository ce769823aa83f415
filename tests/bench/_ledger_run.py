"""One ``bench_ledger.py`` run: its options, the ledgers and workers it prepares, its findings.

``Run`` copies the cached ledgers into a work directory (and into throwaway PostgreSQL
databases), starts ``_ledger_worker.py`` processes through ``bench_protect.Worker``, drives
them in alternating rounds, and reads each worker's I/O and server counters; ``close()`` stops
the workers, drops the databases and removes the work directory, whatever happened.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _ledger_fill as fill  # noqa: E402
import _ledger_pg as pg  # noqa: E402
import _protect_ref as ref  # noqa: E402
import bench_protect as bp  # noqa: E402

# bench_protect.Worker starts the script its module names; ours speaks the same protocol.
bp.WORKER = HERE / "_ledger_worker.py"

ROUND_CAP_S = 15.0  # a round stops at its call count or after this long (slow stores do fewer)
MAX_SIZE = 2_000_000

Samples = dict[str, list[dict[str, Any]]]


def label(size: int) -> str:
    for unit, div in (("M", 1_000_000), ("k", 1_000)):
        if size >= div and size % div == 0:
            return f"{size // div}{unit}"
    return str(size)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} ({os.cpu_count()} CPUs)"


def paired(results: Samples, a: str, b: str) -> float | None:
    """The median over rounds of a's cost over b's in the same round: drift falls on both."""
    ratios = [
        (x["seconds"] / x["calls"]) / (y["seconds"] / y["calls"])
        for x, y in zip(results.get(a, []), results.get(b, []), strict=False)
        if x.get("calls") and y.get("calls")
    ]
    return statistics.median(ratios) if ratios else None


def proc_io(pid: int) -> dict[str, int] | None:
    """A process's syscall I/O counters (Linux), or None where there are none."""
    try:
        with open(f"/proc/{pid}/io", encoding="ascii") as fh:
            pairs = (line.split(": ") for line in fh.read().splitlines() if line)
            return {k: int(v) for k, v in pairs}
    except OSError:
        return None


def parse_sizes(text: str) -> list[int]:
    sizes = sorted({int(s.replace("_", "")) for s in text.split(",") if s.strip()})
    if not sizes or sizes[0] < 1 or sizes[-1] > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"sizes between 1 and {MAX_SIZE:,}")
    return sizes


class Run:
    """One run: its options, what it found, and what it must clean up."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.say = (lambda *a: None) if args.json else print
        self.out: dict[str, Any] = {"sizes": args.sizes, "load_start": os.getloadavg()}
        self.goals: dict[str, dict[str, Any]] = {}
        self.out["goals"] = self.goals
        self.workdir = Path(tempfile.mkdtemp(prefix="ctrlrun-bench-ledger-"))
        self.dbs: pg.Databases | None = None
        self.workers: list[bp.Worker] = []
        self.made: dict[str, int] = {}  # calls each worker made, for per-call server counters
        self.pg_before: dict[str, dict[str, int]] = {}  # pg_stat_database before the calls
        self.budget = bp.Budget(args.max_seconds)

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.workers = []
        if self.dbs is not None:
            for left in self.dbs.drop_all():
                print(f"bench_ledger: could not drop {left}", file=sys.stderr)
        shutil.rmtree(self.workdir, ignore_errors=True)

    # -- the ledgers ---------------------------------------------------------------------------

    def ledgers(self) -> dict[int, dict[str, Any]]:
        """Each size's cached SQLite ledger, copied (and synced) into the work directory."""
        args, say = self.args, self.say
        say(f"\nledgers (SQLite, cached in {args.cache_dir}):")
        ledgers: dict[int, dict[str, Any]] = {}
        for size in args.sizes:
            rep = fill.cached_sqlite(args.cache_dir, size, max_seconds=args.fill_max_seconds)
            copy = self.workdir / f"ledger-{size}.db"
            t0 = time.monotonic()
            shutil.copyfile(rep.path, copy)
            # On disk before measuring: else the first checkpoint's fsync pays for the copy.
            fd = os.open(copy, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            ledgers[size] = {
                "effects": rep.effects,
                "events": rep.events,
                "receipts": rep.receipts,
                "ambiguous": rep.ambiguous,
                "mb": rep.path.stat().st_size / 1e6,
                "fill_seconds": None if rep.cached else rep.seconds,
                "copy_seconds": time.monotonic() - t0,
                "sqlite": str(copy),
            }
            how = "cached" if rep.cached else f"filled in {rep.seconds:.1f} s"
            say(
                f"  {label(size):>5}: {rep.effects:>9,} effects {rep.events:>10,} events "
                f"{rep.receipts:>9,} receipts {rep.ambiguous:>6,} ambiguous "
                f"{ledgers[size]['mb']:>7,.0f} MB  {how}; copied and synced in "
                f"{ledgers[size]['copy_seconds']:.1f} s"
            )
        self.out["ledgers"] = ledgers
        return ledgers

    def postgres(self, ledgers: dict[int, dict[str, Any]]) -> str | None:
        """Copy each ledger into a throwaway database; the reference's python, if usable."""
        args, say = self.args, self.say
        try:
            self.dbs = pg.Databases(args.pg_url)
        except Exception as exc:
            self.out["postgres"] = f"not measured: {exc}"
            say(f"PostgreSQL: NOT MEASURED — {exc}")
            return None
        for size in args.sizes:
            url = self.dbs.create(label(size))
            secs = fill.copy_to_postgres(
                Path(ledgers[size]["sqlite"]), pg.libpq(url), max_seconds=args.fill_max_seconds
            )
            ledgers[size]["postgres"] = pg.libpq(url)
            ledgers[size]["pg_copy_seconds"] = secs
            say(f"  {label(size):>5}: copied to PostgreSQL {url.database} in {secs:.1f} s")
        failed = self.dbs.checkpoint()
        if failed:
            say(f"  CHECKPOINT after the load failed ({failed}); the figures may pay for it")
        if args.no_reference:
            self.out["reference_venv"] = "skipped (--no-reference)"
            return None
        ref_python, note = ref.reference_python(args.cache_dir, timeout=180)
        if ref_python is not None:
            ok, why = pg.reference_psycopg(ref_python, timeout=180)
            note = f"{note}; {why}"
            ref_python = ref_python if ok else None
        self.out["reference_venv"] = note
        say(f"reference {bp.REFERENCE}: {note}")
        return ref_python

    # -- workers ------------------------------------------------------------------------------

    def start(self, name: str, python: str, store: dict[str, Any]) -> bp.Worker:
        w = bp.Worker(name, python, timeout=60)
        self.workers.append(w)
        w.info = w.ask(300, op="open", store=store, seed=1000 + len(self.workers))["ready"]
        w.info["store"] = store
        self.say(
            f"{name:>17}: ctrlrun {w.info['version']} from {w.info['module']}; {w.info['pragmas']}"
        )
        if self.args.warmup:
            done = w.ask(300, op="sync", calls=self.args.warmup, max_seconds=60)
            self.made[name] = done["calls"]
        return w

    def rounds(self, workers: list[bp.Worker], rounds: int, calls: int) -> Samples:
        """Alternating rounds; also each SQLite worker's file I/O (syscalls) per measured call."""
        before = {w.label: proc_io(w.proc.pid) for w in workers}
        results = bp.rounds_of(workers, "sync", rounds, self.budget, ROUND_CAP_S, calls=calls)
        io = self.out.setdefault("io_per_call", {})
        for w in workers:
            n = sum(x["calls"] for x in results[w.label])
            self.made[w.label] = self.made.get(w.label, 0) + n
            a, b = before[w.label], proc_io(w.proc.pid)
            if a and b and n and w.info["store"]["kind"] == "sqlite":  # PostgreSQL: socket I/O
                io[w.label] = {k: (b[k] - a[k]) / n for k in ("rchar", "wchar", "syscr", "syscw")}
        return results

    def stop_workers(self) -> dict[str, dict[str, float]]:
        """Stop every worker; PostgreSQL's ``pg_stat_database`` deltas per call, by worker."""
        for w in self.workers:
            w.close()
        if self.dbs is None:
            self.workers = []
            return {}
        before = self.pg_before
        time.sleep(1.0)  # an exiting backend flushes its counters
        after = self.dbs.stats()
        server: dict[str, dict[str, float]] = {}
        for w in self.workers:
            db = str(w.info["store"].get("url", "")).rsplit("/", 1)[-1]
            if db in after and self.made.get(w.label):
                server[w.label] = {
                    k: (v - before.get(db, {}).get(k, 0)) / self.made[w.label]
                    for k, v in after[db].items()
                }
        self.workers = []
        self.out["server_per_call"] = server
        return server
