"""The ledger at scale: a protected call and the CLI's reads with up to a million effects stored.

    python tests/bench/bench_ledger.py                          # SQLite, 1k / 100k / 1M effects
    python tests/bench/bench_ledger.py --postgres               # and PostgreSQL, and the reference
    python tests/bench/bench_ledger.py --sizes 1000,100000 --json

1. The cost of an allowed ``@protect`` call (fresh effect key) on ledgers already holding 1k,
   100k and 1M effects (with their receipts and events); goal: the largest within 1.2x of the
   smallest.
2. ``ctrlrun receipts --last 20`` and ``ctrlrun effects --state ambiguous`` on the largest
   ledger, as a subprocess and as the library call alone, with the query plans; goal: < 0.3 s.
3. With ``--postgres``: the same calls on PostgreSQL, and ours against the reference
   ``ctrlrun==0.12.2``'s ``PostgresStateStore`` on the same server; goal: ours <= 0.5x theirs.

Ledgers are filled by ``_ledger_fill.py`` (bulk inserts, not a million calls) once and cached
under ``~/.cache/ctrlrun-bench/``; each run measures copies, so the cache stays as filled.
Workers are ``_ledger_worker.py`` processes driven round by round, alternately, by
``bench_protect.py``'s helpers. Everything is bounded by counts and by time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _ledger_pg as pg  # noqa: E402
import _ledger_queries as queries  # noqa: E402
import bench_protect as bp  # noqa: E402
from _ledger_run import Run, Samples, label, load, paired, parse_sizes, verdict  # noqa: E402

GOAL_SCALE = 1.2  # the largest ledger's call cost over the smallest's
GOAL_QUERY_S = 0.3
GOAL_PG_RATIO = 0.5  # our PostgreSQL call over the reference's
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
OURS, THEIRS = "ours pg fresh", "theirs pg fresh"


def report_calls(run: Run, results: Samples, title: str) -> dict[str, Any]:
    calls = {name: bp.summary(samples) for name, samples in results.items()}
    run.out.setdefault("calls", {}).update(calls)
    run.say(title)
    io = run.out.get("io_per_call", {})
    for name, s in calls.items():
        run.say(f"  {name:>17}: {bp.fmt(s)}")
        if name in io:
            v = io[name]
            run.say(
                f"  {'':>17}  syscall I/O per call: read {v['rchar'] / 1024:.1f} KiB in "
                f"{v['syscr']:.1f} calls, wrote {v['wchar'] / 1024:.1f} KiB in {v['syscw']:.1f}"
            )
    return calls


def goal_ratio(
    run: Run, results: Samples, calls: dict[str, Any], a: str, b: str, goal: float, name: str
) -> None:
    x, y = calls.get(a), calls.get(b)
    if not x or not y:
        return
    ratio = x["us_per_call"] / y["us_per_call"]
    cpu = x["cpu_us_per_call"] / y["cpu_us_per_call"]
    per_round = paired(results, a, b)
    run.goals[name] = {
        "ratio": ratio,
        "cpu_ratio": cpu,
        "paired_ratio": per_round,
        "pass": ratio <= goal,
    }
    run.say(
        f"  {a} / {b} = {ratio:.2f}  (CPU {cpu:.2f}; median of per-round ratios "
        f"{per_round or 0:.2f})  {verdict(ratio <= goal)} (goal <= {goal})"
    )


def report_reads(run: Run, ledgers: dict[int, dict[str, Any]]) -> None:
    args, say = run.args, run.say
    biggest = args.sizes[-1]
    say(
        f"\n2. reads on the {label(biggest)} ledger (median of {args.query_runs} runs, "
        f"after one; goal < {GOAL_QUERY_S} s)"
    )
    wall, cpu = queries.cli_startup(runs=args.query_runs, timeout=60, cwd=str(run.workdir))
    run.out["cli_startup"] = {"seconds": statistics.median(wall), "cpu": statistics.median(cpu)}
    say(
        f"  CLI start-up alone (`ctrlrun --version`): {statistics.median(wall):.3f} s "
        f"(range {min(wall):.3f}–{max(wall):.3f}; CPU {statistics.median(cpu):.3f} s)"
    )
    stores = [("sqlite", f"sqlite:///{ledgers[biggest]['sqlite']}")]
    if "postgres" in ledgers[biggest]:
        stores.append(("postgresql", ledgers[biggest]["postgres"]))
    run.out["queries"] = []
    for backend, url in stores:
        for q in queries.measure(
            url, backend, runs=args.query_runs, timeout=60, cwd=str(run.workdir)
        ):
            run.out["queries"].append(q.__dict__)
            lib_ok = q.library_s < GOAL_QUERY_S
            cli_ok = q.cli_s is not None and q.cli_s < GOAL_QUERY_S
            cli = "n/a" if q.cli_s is None else f"{q.cli_s:.3f} s (CPU {q.cli_cpu_s:.3f} s)"
            say(
                f"  {backend:>10} {q.query:<26} library {q.library_s * 1000:7.1f} ms "
                f"{verdict(lib_ok)}   CLI {cli} {verdict(cli_ok)}   "
                f"{q.rows} items, {q.cli_lines} lines"
            )
            if q.error:
                say(f"      CLI failed: {q.error}")
            run.goals[f"{backend} {q.query}: library < {GOAL_QUERY_S} s"] = {
                "seconds": q.library_s,
                "pass": lib_ok,
            }
            run.goals[f"{backend} {q.query}: CLI < {GOAL_QUERY_S} s"] = {
                "seconds": q.cli_s,
                "pass": cli_ok,
            }
            for plan in q.plans:
                say(f"      {plan['sql'][:150]}")
                for line in plan["plan"]:
                    say(f"        {line}")


def report_server(run: Run, server: dict[str, dict[str, float]], floor: float | None) -> None:
    say = run.say
    if floor is not None:
        say(
            f"  one durable commit on this server (INSERT + COMMIT, median of 200): "
            f"{floor * 1e6:.0f} µs"
        )
    if not server:
        return
    say("  server work per call (pg_stat_database deltas / calls; opening and warm-up included):")
    say(
        f"    {'':>17} {'commits':>8} {'rollbacks':>9} {'inserted':>9} {'updated':>8} "
        f"{'fetched':>8} {'blks read':>9} {'blks hit':>9}"
    )
    for name, v in server.items():
        say(
            f"    {name:>17} {v['xact_commit']:8.2f} {v['xact_rollback']:9.2f} "
            f"{v['tup_inserted']:9.2f} {v['tup_updated']:8.2f} {v['tup_fetched']:8.1f} "
            f"{v['blks_read']:9.2f} {v['blks_hit']:9.1f}"
        )


def profile(run: Run, names: list[str]) -> None:
    run.out.setdefault("profile", {})
    for w in run.workers:
        if w.label not in names:
            continue
        prof = w.ask(600, op="profile", calls=1000, top=25)
        run.made[w.label] = run.made.get(w.label, 0) + prof["calls"]
        run.out["profile"][w.label] = prof
        run.say(f"\ncProfile, {w.label}, {prof['calls']} calls, top 25 by cumulative time")
        run.say(prof["cumulative"].rstrip())
        run.say(f"\n{w.label}, top 25 by own time")
        run.say(prof["tottime"].rstrip())


def measure(run: Run) -> None:
    args, say = run.args, run.say
    ledgers = run.ledgers()
    ref_python = run.postgres(ledgers) if args.postgres else None
    dbs = run.dbs
    run.pg_before = dbs.stats() if dbs is not None else {}

    # -- 1: the protected call, by ledger size (SQLite, and PostgreSQL with --postgres) -------
    say("")
    sized = [
        run.start(f"sqlite {label(n)}", sys.executable, {"kind": "sqlite", "path": led["sqlite"]})
        for n, led in ledgers.items()
    ]
    if dbs is not None:
        sized += [
            run.start(f"postgresql {label(n)}", sys.executable, {"kind": "postgres", "url": url})
            for n, led in ledgers.items()
            if (url := led.get("postgres"))
        ]
    say(f"\nload average before the rounds: {load()}")
    results = run.rounds(sized, args.rounds, args.calls)
    calls = report_calls(
        run,
        results,
        f"\n1. allowed protected call, fresh random effect key (median of {args.rounds} rounds "
        f"x {args.calls} calls, rounds alternating between ledgers)",
    )
    small, big = label(args.sizes[0]), label(args.sizes[-1])
    if len(args.sizes) > 1:
        for backend in ("sqlite", "postgresql"):
            goal_ratio(
                run,
                results,
                calls,
                f"{backend} {big}",
                f"{backend} {small}",
                GOAL_SCALE,
                f"{backend} call {big}/{small} <= {GOAL_SCALE}",
            )
    if args.profile:
        profile(run, [f"sqlite {big}", f"postgresql {big}"])

    # -- 3: PostgreSQL against SQLite, and ours against the reference on fresh databases -------
    floor = None
    ref_results: Samples = {}
    ref_calls: dict[str, Any] = {}
    if dbs is not None and ref_python is not None:
        for w in sized:  # keep the server to the two measured here
            w.close()
        ours_url, theirs_url, floor_url = (dbs.create(n) for n in ("ours", "theirs", "floor"))
        fresh = {u.database for u in (ours_url, theirs_url)}
        run.pg_before.update({db: v for db, v in dbs.stats().items() if db in fresh})
        pair = [
            run.start(OURS, sys.executable, {"kind": "postgres", "url": pg.libpq(ours_url)}),
            run.start(THEIRS, ref_python, {"kind": "postgres", "url": pg.libpq(theirs_url)}),
        ]
        floor = dbs.commit_floor(floor_url)
        ref_results = run.rounds(pair, args.ref_rounds, args.ref_calls)
        if args.profile:
            profile(run, [OURS, THEIRS])
    server = run.stop_workers()

    # -- 2: the CLI's reads (after the workers are gone) ---------------------------------------
    report_reads(run, ledgers)

    if dbs is not None:
        say("\n3. PostgreSQL against SQLite on the same ledger (wall time per call)")
        for n in args.sizes:
            lite, post = (calls.get(f"{b} {label(n)}") for b in ("sqlite", "postgresql"))
            if lite and post:
                r = post["us_per_call"] / lite["us_per_call"]
                run.goals[f"postgresql/sqlite call at {label(n)}"] = {"ratio": r}
                say(f"  {label(n):>5}: postgresql / sqlite = {r:.2f}")
        if ref_results:
            ref_calls = report_calls(
                run,
                ref_results,
                f"\n   ours against the reference {bp.REFERENCE} PostgresStateStore, fresh "
                f"databases on the same server (median of {args.ref_rounds} alternating rounds "
                f"x {args.ref_calls} calls; CPU is the client's, not the server's)",
            )
            goal_ratio(
                run,
                ref_results,
                ref_calls,
                OURS,
                THEIRS,
                GOAL_PG_RATIO,
                f"postgresql call ours/reference <= {GOAL_PG_RATIO}",
            )
        else:
            say("  ours / reference: not measured (no reference venv, or --no-reference)")
        report_server(run, server, floor)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: python tests/bench/bench_ledger.py --sizes 1000,100000,1000000 --postgres",
    )
    ap.add_argument(
        "--sizes",
        type=parse_sizes,
        default=[1_000, 100_000, 1_000_000],
        help="effects already in each ledger (default 1000,100000,1000000)",
    )
    ap.add_argument(
        "--postgres", action="store_true", help="also PostgreSQL, and the reference's store"
    )
    ap.add_argument(
        "--pg-url", default=DEFAULT_PG, help=f"where to create throwaway databases ({DEFAULT_PG})"
    )
    ap.add_argument("--rounds", type=int, default=7, help="measured rounds per ledger (median)")
    ap.add_argument("--calls", type=int, default=1000, help="protected calls per round")
    ap.add_argument("--ref-rounds", type=int, default=21, help="rounds, ours against reference")
    ap.add_argument("--ref-calls", type=int, default=200, help="calls per round, same")
    ap.add_argument("--warmup", type=int, default=300, help="calls per worker before measuring")
    ap.add_argument("--query-runs", type=int, default=5, help="timed runs of each read (median)")
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=300.0,
        help="wall-clock budget for the measured rounds (default 300)",
    )
    ap.add_argument(
        "--fill-max-seconds",
        type=float,
        default=600.0,
        help="budget for filling, or copying to PostgreSQL, one ledger (default 600)",
    )
    ap.add_argument(
        "--cache-dir",
        type=Path,
        default=bp.default_cache(),
        help="filled ledgers and the reference venv (default ~/.cache/ctrlrun-bench)",
    )
    ap.add_argument("--no-reference", action="store_true", help="with --postgres: ours only")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="cProfile 1,000 calls on the largest ledgers (and ours/theirs on PostgreSQL)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = ap.parse_args(argv)
    counts = (args.rounds, args.calls, args.ref_rounds, args.ref_calls, args.query_runs)
    if min(counts) < 1 or args.warmup < 0:
        ap.error("counts must be positive")
    if args.postgres:
        try:
            pg.check_loopback(args.pg_url)
        except ValueError as exc:
            ap.error(f"--pg-url: {exc}")

    run = Run(args)
    started = time.monotonic()
    run.say(f"load average at start: {load()}")
    # Ctrl-C and SIGTERM both end up in the cleanup below (SIGINT too when it came in ignored).
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in STOP_SIGNALS}
    try:
        measure(run)
    except (bp.WorkerError, TimeoutError, RuntimeError) as exc:
        print(f"bench_ledger: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the workers and throwaway databases go in ``finally``
        print("\nbench_ledger: interrupted; stopping the workers", file=sys.stderr)
        return 130
    finally:
        for sig in STOP_SIGNALS:  # the cleanup is bounded; a second Ctrl-C must not cut it short
            signal.signal(sig, signal.SIG_IGN)
        run.close()  # the workers, then the throwaway databases and the work directory
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    run.say("\ngoals:")
    for name, g in run.goals.items():
        if "pass" in g:
            figure = (
                f"{g['ratio']:.2f}x"
                if "ratio" in g
                else ("n/a" if g["seconds"] is None else f"{g['seconds']:.3f} s")
            )
            run.say(f"  {verdict(g['pass'])}  {name:<52} {figure}")
    run.out["load_end"] = os.getloadavg()
    run.out["seconds"] = time.monotonic() - started
    if run.budget.exhausted:
        run.out["truncated"] = True
        run.say(f"\nNOTE: the {args.max_seconds:.0f} s budget ran out; some rounds did not run")
    run.say(f"\nload average at end: {load()}; the whole run took {run.out['seconds']:.0f} s")
    if args.json:
        print(json.dumps(run.out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
