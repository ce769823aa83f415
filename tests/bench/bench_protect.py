"""The cost of a protected call: this repository's ctrlrun against the reference ctrlrun 0.12.2.

    python tests/bench/bench_protect.py            # ~30 s once the reference venv exists
    python tests/bench/bench_protect.py --profile  # and a cProfile of ours, top 25 cumulative

Both distributions import as ``ctrlrun``, so each runs in its own worker process
(``_protect_worker.py``): ours under this interpreter, the reference under a venv this script
creates once under ``~/.cache/ctrlrun-bench/ref-venv`` (``pip install ctrlrun==0.12.2``) and
reuses. The two workers are driven round by round, alternately, with the same commands, on
their own SQLite files with the same durability (WAL, ``synchronous=NORMAL``; each worker
reports the pragmas its store's connection actually has). Figures are medians over rounds,
after a warm-up. Without the reference (no network, no such version) ours is still measured,
the reason is printed, and the exit status is 0.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REFERENCE = "ctrlrun==0.12.2"
REFERENCE_VERSION = REFERENCE.split("==")[1]
WORKER = Path(__file__).resolve().parent / "_protect_worker.py"
# Issue 15, must-hold 3: ours against the reference, same durability.
GOAL_RATIO = 0.35  # an allowed call
GOAL_DUP_RATIO = 0.3  # a call refused as a duplicate


class WorkerError(RuntimeError):
    """A worker failed, answered nonsense, or ran out of time."""


class Worker:
    """One ``_protect_worker.py`` process, spoken to in JSON lines."""

    def __init__(self, label: str, python: str, timeout: float) -> None:
        self.label = label
        # stderr to a file, not a pipe: a chatty library must not block on a full pipe.
        self.errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in close())
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("CTRLRUN_") and k not in ("PYTHONPATH", "PYTHONHOME")
        }
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


# -- the reference venv ---------------------------------------------------------------------


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ctrlrun-bench"


def reference_python(cache: Path, timeout: float) -> tuple[str | None, str]:
    """The reference venv's interpreter (created on first use), or None and the reason."""
    venv = cache / "ref-venv"
    python = venv / "bin" / "python"
    if _installed_version(python) == REFERENCE_VERSION:
        return str(python), f"reusing {venv}"
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    steps = (
        ("python -m venv", [sys.executable, "-m", "venv", str(venv)]),
        (
            f"pip install {REFERENCE}",
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", REFERENCE],
        ),
    )
    for what, step in steps:
        left = timeout - (time.monotonic() - started)
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=max(left, 1.0))
        except subprocess.TimeoutExpired:
            shutil.rmtree(venv, ignore_errors=True)
            return None, f"`{what}` took longer than {timeout:.0f} s"
        except OSError as exc:
            return None, f"cannot run {step[0]}: {exc}"
        if done.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            lines = [
                ln
                for ln in (done.stderr or done.stdout).splitlines()
                if ln.strip() and not ln.startswith("WARNING: Location")
            ]
            return None, f"`{what}` failed: {' | '.join(lines[-3:])}"
    if _installed_version(python) != REFERENCE_VERSION:
        return None, f"{REFERENCE} did not install into {venv}"
    return str(python), f"created {venv} in {time.monotonic() - started:.1f} s"


def _installed_version(python: Path) -> str | None:
    if not python.exists():
        return None
    probe = "import importlib.metadata as m; print(m.version('ctrlrun'))"
    try:
        done = subprocess.run(
            [str(python), "-I", "-c", probe], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: python tests/bench/bench_protect.py --rounds 7 --profile",
    )
    ap.add_argument("--rounds", type=int, default=7, help="measured rounds per figure (median)")
    ap.add_argument("--calls", type=int, default=1000, help="protected calls per round")
    ap.add_argument("--warmup", type=int, default=300, help="calls per worker before measuring")
    ap.add_argument("--tasks", type=int, default=100, help="concurrent asyncio tasks")
    ap.add_argument("--async-calls", type=int, default=2000, help="calls per async round")
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=150.0,
        help="wall-clock budget for the measurements (default 150)",
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

    out: dict[str, Any] = {"reference": REFERENCE}
    say = (lambda *a: None) if args.json else print

    ref_python, note = (None, "skipped (--no-reference)")
    if not args.no_reference:
        ref_python, note = reference_python(args.cache_dir, timeout=180)
    out["reference_venv"] = note
    if ref_python is None:
        say(f"reference {REFERENCE}: NOT MEASURED — {note}")
    else:
        say(f"reference venv: {note}")

    budget = Budget(args.max_seconds)
    workers: list[Worker] = []
    try:
        workers.append(Worker("ours", sys.executable, timeout=60))
        if ref_python is not None:
            try:
                workers.append(Worker("theirs", ref_python, timeout=60))
            except WorkerError as exc:
                out["reference_venv"] = note = f"reference worker failed to start: {exc}"
                ref_python = None
                say(f"reference {REFERENCE}: NOT MEASURED — {note}")
        for w in workers:
            info = w.info
            out[f"{w.label}_info"] = info
            say(
                f"{w.label:>6}: ctrlrun {info['version']} (python {info['python']}) "
                f"from {info['module']}; pragmas {info['pragmas']}"
            )
        if len(workers) == 2:
            a, b = (w.info["pragmas"] for w in workers)
            same = {k: v for k, v in a.items() if k != "busy_timeout"} == {
                k: v for k, v in b.items() if k != "busy_timeout"
            }
            out["same_durability"] = same
            if same:
                say("durability: the same on both (journal_mode and synchronous match)")
            else:
                say("WARNING: the two stores do not have the same durability settings")

        for w in workers:
            if args.warmup:
                w.ask(120, op="sync", calls=args.warmup, max_seconds=30)
                w.ask(120, op="dup", calls=max(args.warmup // 3, 1), max_seconds=30)
        say(
            f"\nallowed call, fresh effect key each call (median of {args.rounds} rounds "
            f"x {args.calls} calls)"
        )
        fresh = {
            k: summary(v)
            for k, v in rounds_of(
                workers, "sync", args.rounds, budget, 30, calls=args.calls
            ).items()
        }
        for label, s in fresh.items():
            say(f"  {label:>6}: {fmt(s)}")
        out["allow"] = fresh
        ours, theirs = fresh.get("ours"), fresh.get("theirs")
        if ours and theirs:
            ratio = ours["us_per_call"] / theirs["us_per_call"]
            cpu_ratio = ours["cpu_us_per_call"] / theirs["cpu_us_per_call"]
            out["ratio"], out["cpu_ratio"] = ratio, cpu_ratio
            verdict = "meets" if ratio <= GOAL_RATIO else "misses"
            say(
                f"   ratio: ours/theirs = {ratio:.2f}  ({verdict} the goal <= {GOAL_RATIO}; "
                f"CPU ratio {cpu_ratio:.2f})"
            )

        say("\nrefused as a duplicate (the same committed key each call)")
        dup = {
            k: summary(v)
            for k, v in rounds_of(workers, "dup", args.rounds, budget, 20, calls=args.calls).items()
        }
        for label, s in dup.items():
            say(f"  {label:>6}: {fmt(s)}")
        out["duplicate"] = dup
        dours, dtheirs = dup.get("ours"), dup.get("theirs")
        if dours and dtheirs:
            dratio = dours["us_per_call"] / dtheirs["us_per_call"]
            dcpu = dours["cpu_us_per_call"] / dtheirs["cpu_us_per_call"]
            out["duplicate_ratio"], out["duplicate_cpu_ratio"] = dratio, dcpu
            verdict = "meets" if dratio <= GOAL_DUP_RATIO else "misses"
            say(
                f"   ratio: ours/theirs = {dratio:.2f}  ({verdict} the goal <= {GOAL_DUP_RATIO}; "
                f"CPU ratio {dcpu:.2f})"
            )

        say(
            f"\nasync: {args.tasks} concurrent asyncio tasks, distinct keys "
            f"(median of {max(args.rounds // 2, 3)} rounds x {args.async_calls} calls)"
        )
        out["async"] = {}
        modes = [("ours", "native", "async def under @protect")]
        if len(workers) == 2:
            modes.append(
                ("theirs", "to_thread", "asyncio.to_thread(sync @protect); it refuses async def")
            )
        by_label = {w.label: w for w in workers}
        for label, mode, what in modes:
            w = by_label[label]
            if w.info.get("async") is None and mode == "native":
                say(f"  {label:>6}: async def refused: {w.info.get('async_refusal')}")
                continue
            w.ask(
                120,
                op="async",
                calls=min(args.async_calls, 500),
                tasks=args.tasks,
                max_seconds=30,
                mode=mode,
            )
            samples = rounds_of(
                [w],
                "async",
                max(args.rounds // 2, 3),
                budget,
                30,
                calls=args.async_calls,
                tasks=args.tasks,
                mode=mode,
            )[label]
            s = summary(samples)
            out["async"][label] = s and {**s, "mode": mode}
            rate = f"{s['calls_per_s']:9.0f} calls/s" if s else "n/a"
            say(f"  {label:>6}: {rate}   [{what}]")

        if args.profile:
            prof = workers[0].ask(180, op="profile", calls=args.calls, top=25)
            out["profile"] = prof
            say(f"\ncProfile of ours, {prof['calls']} allowed calls, top 25 by cumulative time")
            say(prof["cumulative"].rstrip())
            say("\ntop 25 by own time")
            say(prof["tottime"].rstrip())
    except WorkerError as exc:
        print(f"bench_protect: {exc}", file=sys.stderr)
        return 1
    finally:
        for w in workers:
            w.close()

    if budget.exhausted:
        out["truncated"] = True
        say(f"\nNOTE: the {args.max_seconds:.0f} s budget ran out; later figures have fewer rounds")
    if ref_python is None:
        say(f"\nNOTE: no comparison: the reference {REFERENCE} could not be set up ({note}).")
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
