"""The cost of a protected call: this repository's ctrlrun against the reference ctrlrun 0.12.2.

    python tests/bench/bench_protect.py             # ~1 min once the reference venv exists
    python tests/bench/bench_protect.py --postgres  # and both on PostgreSQL (127.0.0.1:5432)
    python tests/bench/bench_protect.py --profile   # and a cProfile of ours, top 25 cumulative

Both distributions import as ``ctrlrun``, so each runs in its own worker process
(``_protect_worker.py``): ours under this interpreter, the reference under a venv made once
under ``~/.cache/ctrlrun-bench/ref-venv`` (``_protect_ref.py``) and reused. The workers are
driven round by round, alternately, with the same commands, on their own SQLite files with the
same durability (WAL, ``synchronous=NORMAL``; each worker reports the pragmas its store's
connection actually has). With ``--postgres [URL]`` two more workers run the same ops in the
same rounds on PostgreSQL, each in a throwaway database on that loopback server (``_protect_pg.py``:
made at the start, dropped at the end whatever happened), with ``synchronous_commit`` as the
server has it (each reports it); the run prints one durable commit on the server as the floor.
Figures are medians over rounds, after a warm-up. Without the reference (no network, no such
version) or without a PostgreSQL server, the rest is still measured, the reason is printed in
one line, and the exit status is 0.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _protect_pg import DEFAULT_PG, OURS, THEIRS, PgSide, url_problem
from _protect_ref import REFERENCE, default_cache, reference

WORKER = Path(__file__).resolve().parent / "_protect_worker.py"
STORE_ENV = "BENCH_PROTECT_STORE"  # _protect_worker.STORE_ENV
# Issue 15, must-hold 3: ours against the reference, same durability.
GOAL_RATIO = 0.35  # an allowed call
GOAL_DUP_RATIO = 0.3  # a call refused as a duplicate


class WorkerError(RuntimeError):
    """A worker failed, answered nonsense, or ran out of time."""


class Worker:
    """One ``_protect_worker.py`` process, spoken to in JSON lines."""

    def __init__(
        self, label: str, python: str, timeout: float, store: dict[str, Any] | None = None
    ) -> None:
        self.label = label
        # stderr to a file, not a pipe: a chatty library must not block on a full pipe.
        self.errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in close())
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("CTRLRUN_") and k not in ("PYTHONPATH", "PYTHONHOME", STORE_ENV)
        }
        if store is not None:  # the worker's own SQLite file unless it is told otherwise
            env[STORE_ENV] = json.dumps(store)
        # -I: neither the cwd nor PYTHONPATH can put the other distribution's ``ctrlrun`` first.
        self.proc = subprocess.Popen(
            [python, "-I", str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors,
            text=True,
            env=env,
            cwd=str(WORKER.parent),
        )
        self.info: dict[str, Any] = self._read(timeout)["ready"]

    def ask(self, timeout: float, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def _read(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], max(timeout, 1.0))
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            if ready:
                self.proc.wait(timeout=10)
            else:
                self.proc.kill()
                self.proc.wait()
            self.errors.seek(0)
            err = self.errors.read()[-2000:]
            self.close()
            why = "timed out" if not ready else f"exited ({self.proc.returncode})"
            raise WorkerError(f"{self.label} worker {why}: {err.strip()}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise WorkerError(f"{self.label} worker: {answer['error'].strip()}")
        return answer

    def interrupt(self) -> None:
        """Ctrl-C for this worker too (its temporary directory goes away as it exits)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.errors.close()


# -- measuring ------------------------------------------------------------------------------


class Budget:
    """A wall-clock budget for the whole run; each op gets at most what is left."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.exhausted = False

    def op_seconds(self, cap: float) -> float:
        left = self.deadline - time.monotonic()
        if left <= 1.0:
            self.exhausted = True
        return max(min(cap, left), 0.5)


def rounds_of(
    workers: list[Worker], op: str, rounds: int, budget: Budget, cap: float, **cmd: Any
) -> dict[str, list[dict[str, Any]]]:
    """``rounds`` of ``op`` on each worker, alternating which goes first."""
    results: dict[str, list[dict[str, Any]]] = {w.label: [] for w in workers}
    for r in range(rounds):
        order = workers if r % 2 == 0 else workers[::-1]
        for w in order:
            if budget.exhausted:
                return results
            limit = budget.op_seconds(cap)
            results[w.label].append(w.ask(limit + 60, op=op, max_seconds=limit, **cmd))
    return results


def summary(samples: list[dict[str, Any]]) -> dict[str, Any] | None:
    per_call = [s["seconds"] / s["calls"] * 1e6 for s in samples if s.get("calls")]
    if not per_call:
        return None
    med = statistics.median(per_call)
    cpu = [s["cpu_seconds"] / s["calls"] * 1e6 for s in samples if s.get("calls")]
    return {
        "us_per_call": med,
        "cpu_us_per_call": statistics.median(cpu),
        "calls_per_s": 1e6 / med,
        "min_us": min(per_call),
        "max_us": max(per_call),
        "rounds": len(per_call),
        "calls": sum(s["calls"] for s in samples),
    }


def fmt(s: dict[str, Any] | None) -> str:
    if s is None:
        return "n/a"
    return (
        f"{s['us_per_call']:9.1f} µs/call {s['calls_per_s']:9.0f} calls/s"
        f"  (CPU {s['cpu_us_per_call']:.0f} µs; {s['rounds']} rounds, range "
        f"{s['min_us']:.0f}–{s['max_us']:.0f} µs)"
    )


# -- the run --------------------------------------------------------------------------------

PAIRS = (("ours", "theirs"), (OURS, THEIRS))  # SQLite, PostgreSQL
# The same durability: SQLite's journal and sync pragmas; on PostgreSQL synchronous_commit
# (fsync and the WAL are the server's, the same for both databases).
DURABILITY = {"ours": ("journal_mode", "synchronous"), OURS: ("synchronous_commit",)}
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# op -> its figures' key in --json, its ratio keys' prefix, its goal, one round's time cap
SECTIONS = {
    "sync": ("allow", "", GOAL_RATIO, 30.0),
    "dup": ("duplicate", "duplicate_", GOAL_DUP_RATIO, 20.0),
}


def section(out: dict[str, Any], label: str) -> tuple[dict[str, Any], str]:
    """Where a worker's figures go in ``--json``, and its name there."""
    if label in (OURS, THEIRS):
        return out["postgres"], label.removesuffix(" pg")
    return out, label


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: python tests/bench/bench_protect.py --rounds 7 --postgres --profile",
    )
    ap.add_argument("--rounds", type=int, default=7, help="measured rounds per figure (median)")
    ap.add_argument("--calls", type=int, default=1000, help="protected calls per round")
    ap.add_argument("--warmup", type=int, default=300, help="calls per worker before measuring")
    ap.add_argument("--tasks", type=int, default=100, help="concurrent asyncio tasks")
    ap.add_argument("--async-calls", type=int, default=2000, help="calls per async round")
    ap.add_argument(
        "--max-seconds",
        type=float,
        help="wall-clock budget for the measurements (default 150; 300 with --postgres)",
    )
    ap.add_argument(
        "--postgres",
        nargs="?",
        const=DEFAULT_PG,
        metavar="URL",
        help="also both sides on PostgreSQL, each in a throwaway database made on this "
        f"loopback server and dropped at the end (default {DEFAULT_PG})",
    )
    ap.add_argument(
        "--cache-dir",
        type=Path,
        default=default_cache(),
        help="where the reference venv lives (default ~/.cache/ctrlrun-bench)",
    )
    ap.add_argument("--no-reference", action="store_true", help="measure ours only")
    ap.add_argument(
        "--profile", action="store_true", help="also cProfile ours (top 25 by cumulative time)"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = ap.parse_args(argv)
    if min(args.rounds, args.calls, args.tasks, args.async_calls) < 1 or args.warmup < 0:
        ap.error("counts must be positive")
    if args.max_seconds is None:
        args.max_seconds = 300.0 if args.postgres else 150.0
    if args.postgres is not None and (bad := url_problem(args.postgres)):
        ap.error(f"--postgres: {bad}")
    return args


def start_workers(
    workers: list[Worker], ref_python: str | None, pg: PgSide | None, out: dict[str, Any], say: Any
) -> None:
    """Ours on SQLite (or fail), then whichever others can start (or a line saying why not)."""
    plan: list[tuple[str, str, dict[str, Any] | None]] = [("ours", sys.executable, None)]
    if ref_python is not None:
        plan.append(("theirs", ref_python, None))
    if pg is not None:  # THEIRS has a store only when the reference can run
        plan += [
            (n, str(ref_python) if n == THEIRS else sys.executable, st)
            for n, st in pg.stores.items()
        ]
    for label, python, store in plan:
        try:
            w = Worker(label, python, timeout=60 if store is None else 120, store=store)
        except WorkerError as exc:
            if label == "ours":
                raise
            out.setdefault("not_measured", {})[label] = str(exc)
            say(f"{label}: NOT MEASURED — {exc}")
            continue
        workers.append(w)
        dest, name = section(out, label)
        dest[f"{name}_info"] = info = w.info
        what = "pragmas" if store is None else "settings"
        say(
            f"{label:>9}: ctrlrun {info['version']} (python {info['python']}) "
            f"from {info['module']}; {what} {info['pragmas']}"
        )
    check_durability(workers, out, say)


def check_durability(workers: list[Worker], out: dict[str, Any], say: Any) -> None:
    by_label = {w.label: w for w in workers}
    for (a, b), backend in zip(PAIRS, ("SQLite", "PostgreSQL"), strict=True):
        if a not in by_label or b not in by_label:
            continue
        x, y = ({k: by_label[n].info["pragmas"].get(k) for k in DURABILITY[a]} for n in (a, b))
        section(out, a)[0]["same_durability"] = x == y
        if x == y:
            settings = ", ".join(f"{k}={v}" for k, v in x.items())
            say(f"durability, {backend}: the same on both ({settings})")
        else:
            say(f"WARNING: {backend}: not the same durability on both: {x} against {y}")


def timed(
    op: str, workers: list[Worker], args: argparse.Namespace, budget: Budget, out: Any, say: Any
) -> dict[str, Any]:
    """``op``'s rounds; each backend's figures, and its ratio ours/theirs against the goal."""
    key, prefix, goal, cap = SECTIONS[op]
    samples = rounds_of(workers, op, args.rounds, budget, cap, calls=args.calls)
    fig = {label: summary(v) for label, v in samples.items()}
    for a, b in PAIRS:
        present = [n for n in (a, b) if n in fig]
        if not present:
            continue
        dest = section(out, a)[0]
        dest[key] = {section(out, n)[1]: fig[n] for n in present}
        for n in present:
            say(f"  {n:>9}: {fmt(fig[n])}")
        ours, theirs = fig.get(a), fig.get(b)
        if ours and theirs:
            ratio = ours["us_per_call"] / theirs["us_per_call"]
            cpu_ratio = ours["cpu_us_per_call"] / theirs["cpu_us_per_call"]
            dest[f"{prefix}ratio"], dest[f"{prefix}cpu_ratio"] = ratio, cpu_ratio
            verdict = "meets" if ratio <= goal else "misses"
            say(
                f"  {'ratio':>9}: {a}/{b} = {ratio:.2f}  ({verdict} the goal <= {goal}; "
                f"CPU ratio {cpu_ratio:.2f})"
            )
    return fig


def run_async(
    args: argparse.Namespace, workers: list[Worker], budget: Budget, out: dict[str, Any], say: Any
) -> None:
    rounds = max(args.rounds // 2, 3)
    say(
        f"\nasync: {args.tasks} concurrent asyncio tasks, distinct keys "
        f"(median of {rounds} rounds x {args.async_calls} calls)"
    )
    for w in workers:
        dest, name = section(out, w.label)
        results = dest.setdefault("async", {})
        if w.label in ("ours", OURS):
            mode, what = "native", "async def under @protect"
        else:
            mode, what = "to_thread", "asyncio.to_thread(sync @protect); it refuses async def"
        if mode == "native" and w.info.get("async") is None:
            say(f"  {w.label:>9}: async def refused: {w.info.get('async_refusal')}")
            continue
        cmd = {"tasks": args.tasks, "mode": mode}
        w.ask(120, op="async", calls=min(args.async_calls, 500), max_seconds=30, **cmd)
        samples = rounds_of([w], "async", rounds, budget, 30, calls=args.async_calls, **cmd)
        s = summary(samples[w.label])
        results[name] = s and {**s, "mode": mode}
        rate = f"{s['calls_per_s']:9.0f} calls/s" if s else "n/a"
        say(f"  {w.label:>9}: {rate}   [{what}]")


def measure(
    args: argparse.Namespace, workers: list[Worker], pg: PgSide | None, out: Any, say: Any
) -> None:
    for w in workers:
        if args.warmup:
            w.ask(120, op="sync", calls=args.warmup, max_seconds=30)
            w.ask(120, op="dup", calls=max(args.warmup // 3, 1), max_seconds=30)
    say(
        f"\nallowed call, fresh effect key each call (median of {args.rounds} rounds "
        f"x {args.calls} calls)"
    )
    budget = Budget(args.max_seconds)
    fresh = timed("sync", workers, args, budget, out, say)
    if pg is not None and (floor := pg.floor_line(fresh)):
        say(floor)
    say("\nrefused as a duplicate (the same committed key each call)")
    timed("dup", workers, args, budget, out, say)

    run_async(args, workers, budget, out, say)

    if args.profile:
        prof = workers[0].ask(180, op="profile", calls=args.calls, top=25)
        out["profile"] = prof
        say(f"\ncProfile of ours, {prof['calls']} allowed calls, top 25 by cumulative time")
        say(prof["cumulative"].rstrip())
        say("\ntop 25 by own time")
        say(prof["tottime"].rstrip())
    if budget.exhausted:
        out["truncated"] = True
        say(f"\nNOTE: the {args.max_seconds:.0f} s budget ran out; later figures have fewer rounds")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out: dict[str, Any] = {"reference": REFERENCE}
    say = (lambda *a: None) if args.json else print
    workers: list[Worker] = []
    ref_python: str | None = None
    pg = PgSide(args.postgres) if args.postgres is not None else None
    # Ctrl-C and SIGTERM both end up in the cleanup below (SIGINT too when it came in ignored).
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in STOP_SIGNALS}
    try:
        ref_python = reference(args, out, say)
        if pg is not None:
            out["postgres"] = pg.out
            if not pg.open(ref_python, say):
                pg = None
        start_workers(workers, ref_python, pg, out, say)
        measure(args, workers, pg, out, say)
    except KeyboardInterrupt:
        print("\nbench_protect: interrupted; stopping the workers", file=sys.stderr)
        for w in workers:
            w.interrupt()
        return 130
    except WorkerError as exc:
        print(f"bench_protect: {exc}", file=sys.stderr)
        return 1
    finally:
        for sig in STOP_SIGNALS:  # the cleanup is bounded; a second Ctrl-C must not cut it short
            signal.signal(sig, signal.SIG_IGN)
        for w in workers:  # their connections first, then the databases
            w.close()
        if pg is not None:
            pg.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    if ref_python is None or "theirs" in out.get("not_measured", {}):
        why = out.get("not_measured", {}).get("theirs", out["reference_venv"])
        say(f"\nNOTE: no comparison: the reference {REFERENCE} could not be set up ({why}).")
    if "why" in out.get("postgres", {}):
        say(f"NOTE: no PostgreSQL figures: {out['postgres']['why']}")
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
