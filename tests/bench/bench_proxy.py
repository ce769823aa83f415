"""What the sidecar costs on the wire: ``ctrlrun proxy`` against plain ``mitmdump``.

    python tests/bench/bench_proxy.py            # about 1 min 45 s
    python tests/bench/bench_proxy.py --json     # one JSON object instead of lines
    python tests/bench/bench_proxy.py --profile  # then where ctrlrun proxy's time goes (py-spy)
    python tests/bench/bench_proxy.py --baseline ../before/.venv/bin/python  # and another tree's

One run starts a tiny upstream (``_loadgen.py upstream``: 200 to everything), plain
``mitmdump`` in reverse mode in front of it, and ``ctrlrun proxy`` whose reverse listener
guards it as a Stripe upstream (SQLite ledger, ``reconcile: off``). With one load generator
(``_loadgen.py``) it measures the upstream alone ("direct"), mitmdump, ctrlrun on protected
writes (``POST /v1/refunds``, each a new payment intent, so a new effect key) and ctrlrun on
pass-through reads (``GET``): throughput at 8 keep-alive connections, latency at 1, in rounds
that alternate the order of the targets. It prints the ratios to mitmdump against the goals.
Only 127.0.0.1; every child process is stopped on exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.exc import ArgumentError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ledger_pg import Databases, check_loopback
from _loadgen import (
    Child,
    ChildError,
    Result,
    child_env,
    find_tool,
    fold,
    free_port,
    py_spy,
    run_load,
    thread_cpu,
)
from _proxy_extra import (
    DEFAULT_PG,
    SustainError,
    commit_pairs,
    db_errors,
    pg_ledger_counts,
    pg_store_url,
    report_floor,
    report_sustain,
    sustain,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
# Issue 15's must-holds 1 and 2, against mitmdump measured in the same rounds:
GOAL_WRITE_RATE = 1.0  # protected writes: at least mitmdump's throughput
GOAL_WRITE_P50_MS = 0.3  # protected writes: p50 at most 0.3 ms above mitmdump's
GOAL_READ_RATE = 1.5  # pass-through reads: at least 1.5x mitmdump's throughput
GOAL_PG_RATE = 0.7  # protected writes on a PostgreSQL ledger: at least 0.7x mitmdump's
GOAL_PG_P50_MS = 1.0  # and p50 at most 1.0 ms above mitmdump's
HEADROOM = 3.0  # the load generator must drive the upstream this much faster than mitmdump
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{{payment_id}}"
    decision: allow
upstreams:
  stripe:
    profile: stripe
    url: http://127.0.0.1:{port}
    listen: 127.0.0.1:{listen}
    timeout: 30
    reconcile: "off"
"""
GOALS = (  # what, ours, mitmdump's twin, figure, goal (a ratio to mitmdump's, or ms above it)
    (
        "protected writes: throughput",
        "ctrlrun_write",
        "mitmdump_write",
        "req_per_s",
        GOAL_WRITE_RATE,
    ),
    (
        "protected writes: p50 latency",
        "ctrlrun_write",
        "mitmdump_write",
        "p50_ms",
        GOAL_WRITE_P50_MS,
    ),
    (
        "pass-through reads: throughput",
        "ctrlrun_read",
        "mitmdump_read",
        "req_per_s",
        GOAL_READ_RATE,
    ),
    ("pass-through reads: p50 latency", "ctrlrun_read", "mitmdump_read", "p50_ms", None),
    ("PostgreSQL writes: throughput", "pg_write", "mitmdump_write", "req_per_s", GOAL_PG_RATE),
    ("PostgreSQL writes: p50 latency", "pg_write", "mitmdump_write", "p50_ms", GOAL_PG_P50_MS),
)
RUN_ORDER = (
    "direct_write",
    "direct_read",
    "pg_write",
    "mitmdump_write",
    "baseline_write",
    "ctrlrun_write",
    "ctrlrun_read",
    "baseline_read",
    "mitmdump_read",
)
PG_LABEL = "ctrlrun proxy on PostgreSQL, POST"
MAX_SUSTAIN_SECONDS = 600.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
REVERSE = re.compile(r"reverse stripe 127\.0\.0\.1:(\d+)")
# With --baseline: another ctrlrun (another checkout's interpreter) against this one.
BASELINE = (
    ("this tree against the baseline: protected writes", "write"),
    ("this tree against the baseline: pass-through reads", "read"),
)


class BenchError(RuntimeError):
    """A load run failed (a closed connection, an unframed answer)."""


class Requests:
    """The two request shapes; every write names a payment intent never sent before."""

    def __init__(self, run_id: str) -> None:
        self.run_id, self.writes = run_id, 0

    def write(self) -> bytes:
        self.writes += 1
        body = f"payment_intent=pi_{self.run_id}_{self.writes}&amount=100".encode()
        return (
            b"POST /v1/refunds HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer sk_test_bench\r\n"
            b"Content-Type: application/x-www-form-urlencoded\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )

    @staticmethod
    def read() -> bytes:
        return (
            b"GET /v1/refunds/re_bench HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer sk_test_bench\r\n\r\n"
        )


@dataclass
class Target:
    """One thing measured: a port, a request shape, the process whose CPU is counted."""

    name: str
    label: str
    port: int
    kind: str  # "write" | "read"
    child: Child
    rates: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # CPU seconds per request, per round
    latencies_ns: list[int] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    answered: int = 0  # every answer, warm-up included

    def run(
        self,
        requests: Requests,
        *,
        connections: int,
        count: int,
        cap: float,
        latencies: bool = False,
    ) -> tuple[Result, float | None]:
        """One bounded load run, and the child's CPU seconds per request during it."""
        before = self.child.cpu_seconds()
        make = requests.write if self.kind == "write" else requests.read
        res = asyncio.run(
            run_load(
                "127.0.0.1",
                self.port,
                make,
                connections=connections,
                requests=count,
                seconds=cap,
                keep_latencies=latencies,
            )
        )
        after = self.child.cpu_seconds()
        self.answered += res.requests
        self.statuses.update(res.statuses)
        if res.errors:
            raise BenchError(f"{self.label}: {res.errors[0]}")
        per_req = None
        if before is not None and after is not None and res.requests:
            per_req = (after - before) / res.requests
        return res, per_req

    def summary(self) -> dict[str, Any]:
        lat = Result(latencies_ns=self.latencies_ns)
        return {
            "req_per_s": statistics.median(self.rates) if self.rates else None,
            "range_req_per_s": [min(self.rates), max(self.rates)] if self.rates else None,
            "rates": self.rates,
            "cpu": self.cpu,
            "rounds": len(self.rates),
            "cpu_us_per_req": statistics.median(self.cpu) * 1e6 if self.cpu else None,
            "p50_ms": lat.percentile(0.50) if self.latencies_ns else None,
            "p99_ms": lat.percentile(0.99) if self.latencies_ns else None,
            "latency_samples": len(self.latencies_ns),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
        }


def measure(targets: list[Target], requests: Requests, args: argparse.Namespace) -> bool:
    """Warm every target up, then run the rounds; False when the time budget ran out."""
    deadline: float = time.monotonic() + args.max_seconds

    def cap() -> float:
        return max(min(float(args.round_seconds), deadline - time.monotonic()), 0.5)

    for t in targets:  # connections, caches, the ledger's first pages
        t.run(requests, connections=args.connections, count=args.warmup, cap=10)
        t.run(requests, connections=1, count=max(args.warmup // 3, 1), cap=10)
    # Each ctrlrun target runs right next to its mitmdump twin, in either direction.
    order = sorted(targets, key=lambda t: RUN_ORDER.index(t.name))
    for r in range(args.rounds):
        for t in order if r % 2 == 0 else order[::-1]:
            if time.monotonic() > deadline - 1:
                return False
            res, cpu = t.run(requests, connections=args.connections, count=args.requests, cap=cap())
            t.rates.append(res.rate)
            if cpu is not None:
                t.cpu.append(cpu)
            res, _ = t.run(
                requests, connections=1, count=args.latency_requests, cap=cap(), latencies=True
            )
            t.latencies_ns.extend(res.latencies_ns)
    return True


def paired(ours: list[float], plain: list[float]) -> float | None:
    """The median of round-by-round ratios: each pair ran back to back, under the same load."""
    ratios = [a / b for a, b in zip(ours, plain, strict=False) if b]
    return statistics.median(ratios) if ratios else None


def goals(fig: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """ctrlrun proxy against mitmdump on the same requests, each with its verdict."""
    out = []
    for what, name, twin, key, goal in GOALS:
        if name not in fig:
            continue
        ours, plain = fig[name], fig[twin]
        rate = key == "req_per_s"
        if rate:
            value, cpu = paired(ours["rates"], plain["rates"]), paired(ours["cpu"], plain["cpu"])
        else:
            a, b = ours[key], plain[key]
            value, cpu = (None if a is None or b is None else a - b), None
        verdict = None
        if value is not None and goal is not None:
            verdict = "PASS" if (value >= goal if rate else value <= goal) else "MISS"
        out.append(
            {
                "what": what,
                "value": value,
                "unit": "x" if rate else "ms",
                "goal": goal,
                "verdict": verdict,
                "cpu_ratio": cpu,
            }
        )
    return out


def against_baseline(fig: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """With a baseline: it against mitmdump, and this tree against it (paired rounds)."""
    if "baseline_write" not in fig:
        return []
    out = []
    for kind in ("write", "read"):
        for ours, theirs in (("baseline", "mitmdump"), ("ctrlrun", "baseline")):
            a, b = fig[f"{ours}_{kind}"], fig[f"{theirs}_{kind}"]
            out.append(
                {
                    "what": f"{ours} / {theirs}, {kind}s",
                    "value": paired(a["rates"], b["rates"]),
                    "cpu_ratio": paired(a["cpu"], b["cpu"]),
                }
            )
    return out


def ledger_counts(db: Path) -> dict[str, int]:
    """Effects by state in the proxy's SQLite ledger (read-only)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        rows = conn.execute("SELECT state, count(*) FROM effects GROUP BY state").fetchall()
    finally:
        conn.close()
    return {str(state): int(n) for state, n in rows}


# -- the profile ----------------------------------------------------------------------------


def profile(
    target: Target, requests: Requests, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    """ctrlrun proxy under protected writes (or reads): CPU per request by thread (``/proc``), and
    py-spy's samples of the thread holding the GIL (the Python work, which one GIL runs)."""
    proxy = target.child
    with py_spy(proxy.pid, args.profile_seconds + 1, workdir / "proxy.folded") as folded:
        time.sleep(1.0)  # py-spy attaches
        before = thread_cpu(proxy.pid)
        res, _ = target.run(
            requests, connections=args.connections, count=10**9, cap=args.profile_seconds
        )
        after = thread_cpu(proxy.pid)
    us = {
        tid: (cpu - before.get(tid, 0.0)) / max(res.requests, 1) * 1e6 for tid, cpu in after.items()
    }
    others = [v for tid, v in us.items() if tid != proxy.pid and v > 0]
    out: dict[str, Any] = {
        "load": {"write": "protected writes", "read": "pass-through reads"}[target.kind]
        + (" on PostgreSQL" if target.name == "pg_write" else ""),
        "requests": res.requests,
        "req_per_s": res.rate,
        "cpu_us_per_req": {
            "event loop (main thread)": us.get(proxy.pid, 0.0),
            f"other threads ({len(others)} busy: asyncio.to_thread, i.e. the ledger)": sum(others),
        },
    }
    if folded.stacks is None:
        out["error"] = folded.error
    else:
        out.update(fold(folded.stacks, args.top, REPO))
    return out


# -- running it -----------------------------------------------------------------------------


def start(
    workdir: Path,
    children: list[Child],
    say: Callable[..., None],
    baseline: str | None = None,
    pg_store: str | None = None,
) -> list[Target]:
    """Start the upstream, mitmdump and ctrlrun proxy (into ``children``, to be stopped
    whatever happens), with ``baseline`` a second ctrlrun proxy run by that interpreter, and
    with ``pg_store`` one more of this tree on that PostgreSQL ledger; the targets."""
    mitmdump = find_tool("mitmdump")
    if mitmdump is None:
        raise ChildError(
            "mitmdump not found beside this python or on PATH (pip install -e '.[proxy]')"
        )
    env = child_env()
    up = Child(
        "upstream", [sys.executable, "-I", str(HERE / "_loadgen.py"), "upstream"], workdir, env
    )
    children.append(up)
    up_port = int(up.wait_for_line(re.compile(r"listening (\d+)"), 15)[1])
    plain_port = free_port()
    # confdir: mitmproxy would otherwise write a CA into ~/.mitmproxy.
    mode = f"reverse:http://127.0.0.1:{up_port}@127.0.0.1:{plain_port}"
    argv = [mitmdump, "--mode", mode, "-q", "--set", f"confdir={workdir / 'mitm-plain'}"]
    plain = Child("mitmdump", argv, workdir, env)
    children.append(plain)
    lite = f"sqlite:///{workdir / 'ctrlrun-state.db'}"
    proxies = {"ctrlrun": _ctrlrun(sys.executable, "ctrlrun", workdir, up_port, env, lite)}
    if baseline:
        db = f"sqlite:///{workdir / 'baseline-state.db'}"
        proxies["baseline"] = _ctrlrun(baseline, "baseline", workdir, up_port, env, db)
    if pg_store:
        proxies["pg"] = _ctrlrun(sys.executable, "pg", workdir, up_port, env, pg_store)
    children.extend(proxies.values())
    plain.wait_for_port(plain_port, 30)
    ports = {name: int(child.wait_for_line(REVERSE, 30)[1]) for name, child in proxies.items()}
    say(
        f"upstream 127.0.0.1:{up_port} (_loadgen.py: 200 to everything), mitmdump "
        f"127.0.0.1:{plain_port}, ctrlrun proxy 127.0.0.1:{ports['ctrlrun']} (SQLite, "
        "reconcile off)"
        + (f", baseline {baseline} 127.0.0.1:{ports['baseline']}" if baseline else "")
        + (f", ctrlrun proxy on PostgreSQL 127.0.0.1:{ports['pg']}" if pg_store else "")
    )
    targets = [
        Target("direct_write", "direct, POST", up_port, "write", up),
        Target("direct_read", "direct, GET", up_port, "read", up),
        Target("mitmdump_write", "mitmdump, POST", plain_port, "write", plain),
        Target("mitmdump_read", "mitmdump, GET", plain_port, "read", plain),
    ]
    for name, child in proxies.items():
        if name == "pg":  # reads never touch the ledger: only its writes are measured
            targets.append(Target("pg_write", PG_LABEL, ports[name], "write", child))
            continue
        label = "ctrlrun proxy" if name == "ctrlrun" else "baseline"
        targets += [
            Target(f"{name}_write", f"{label}, protected POST", ports[name], "write", child),
            Target(f"{name}_read", f"{label}, pass-through GET", ports[name], "read", child),
        ]
    return targets


def _ctrlrun(
    python: str, name: str, workdir: Path, up_port: int, env: dict[str, str], store: str
) -> Child:
    """``ctrlrun proxy`` run by ``python`` on the ledger ``store``, guarding the upstream."""
    # The policy refuses port 0: pick a free one, then read back what the proxy bound.
    policy = workdir / f"{name}.yaml"
    policy.write_text(POLICY.format(port=up_port, listen=free_port()))
    flags = {
        "--policy": str(policy),
        "--store-url": store,
        "--listen": "127.0.0.1:0",
        "--principal": "bench-agent",
        "--confdir": str(workdir / f"mitm-{name}"),
        "--sweep-interval": "0",
    }
    argv = [python, "-m", "ctrlrun.cli", "proxy", *(x for kv in flags.items() for x in kv)]
    return Child(f"{name}-proxy", argv, workdir, env)


def report(out: dict[str, Any], targets: list[Target], say: Callable[..., None]) -> None:
    def num(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    fig = out["figures"]
    say(f"\n  {'':<34} {'req/s':>7} {'(range)':>13}  {'p50 ms':>6} {'p99 ms':>7}  {'CPU µs':>6}")
    for t in targets:
        s = fig[t.name]
        rng = "({:.0f}–{:.0f})".format(*s["range_req_per_s"]) if s["range_req_per_s"] else "-"
        say(
            f"  {t.label:<34} {num(s['req_per_s'], '7.0f')} {rng:>13}  "
            f"{num(s['p50_ms'], '6.2f')} {num(s['p99_ms'], '7.2f')}  "
            f"{num(s['cpu_us_per_req'], '6.0f')}"
        )
        if set(s["statuses"]) != {"200"}:
            say(f"    WARNING: answers {s['statuses']}, not all 200: that figure means little")
    say(
        "  (CPU µs: user + system time of the serving process per request, all its threads, "
        "at 8 connections)"
    )
    say("\nctrlrun proxy against plain mitmdump, same requests (ratios: median over rounds)")
    for g in out["goals"]:
        v, goal, x = g["value"], g["goal"], g["unit"] == "x"
        value = "n/a" if v is None else f"{v:.2f}x" if x else f"{v:+.2f} ms"
        aim = "" if goal is None else f"goal >= {goal:.2f}x" if x else f"goal <= +{goal:.1f} ms"
        cpu = "" if g["cpu_ratio"] is None else f"  (CPU per request {g['cpu_ratio']:.2f}x)"
        say(f"  {g['what']:<34} {value:>9}   {aim:<16} {g['verdict'] or '':<4}{cpu}")
    if out.get("baseline"):
        say("\nagainst the baseline (throughput ratio, median over rounds; CPU per request)")
        for c in out["baseline"]:
            value = "n/a" if c["value"] is None else f"{c['value']:.2f}x"
            cpu = "" if c["cpu_ratio"] is None else f"  (CPU per request {c['cpu_ratio']:.2f}x)"
            say(f"  {c['what']:<34} {value:>9}{cpu}")
    if out.get("loadgen_headroom") is not None:
        ok = out["loadgen_headroom"] >= HEADROOM
        say(
            f"\nload generator: drives the upstream alone {out['loadgen_headroom']:.1f}x faster "
            f"than mitmdump: {'not the bottleneck' if ok else 'WARNING: it may be the bottleneck'}"
        )
    for name, ledger in out["ledgers"].items():
        sent = out["writes_answered"][name]
        same = ledger.get("committed") == sent and len(ledger) == 1
        say(
            f"ledger ({name}): {ledger} for {sent} protected writes answered "
            f"({'one committed effect each' if same else 'MISMATCH'})"
        )


def report_profile(prof: dict[str, Any], say: Callable[..., None]) -> None:
    say(
        f"\nprofile: ctrlrun proxy under {prof['load']}, {prof['requests']} requests at "
        f"{prof['req_per_s']:.0f} req/s"
    )
    say(
        "  CPU per request: "
        + "; ".join(f"{k} {v:.0f} µs" for k, v in prof["cpu_us_per_req"].items())
    )
    if "error" in prof:
        say(f"  {prof['error']}")
        return
    say(f"  py-spy --gil: {prof['samples']} samples of whichever thread held the GIL")
    for title, key in (
        ("by thread", "threads"),
        ("by package (of the sampled frame)", "packages"),
        ("ctrlrun's functions, inclusive (with what they call)", "ctrlrun_inclusive"),
        ("functions, own samples", "own"),
    ):
        say(f"\n  {title}")
        for name, pct in prof[key]:
            say(f"  {pct:5.1f}%  {name}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: python tests/bench/bench_proxy.py --rounds 3 --profile",
    )
    add = ap.add_argument
    add("--rounds", type=int, default=5, help="measured rounds per target (default 5)")
    add("--requests", type=int, default=2000, help="requests per throughput run (default 2000)")
    add("--latency-requests", type=int, default=600, help="per latency run (default 600)")
    add("--connections", type=int, default=8, help="for throughput (default 8)")
    add("--warmup", type=int, default=300, help="warm-up requests per target (default 300)")
    add("--round-seconds", type=float, default=8.0, help="cap of one load run (default 8)")
    add(
        "--max-seconds",
        type=float,
        help="budget of the rounds (default 150; +70 with --baseline, +40 with --postgres)",
    )
    add(
        "--baseline",
        metavar="PYTHON",
        help="also measure the ctrlrun proxy of this interpreter (another checkout's venv)",
    )
    add(
        "--postgres",
        nargs="?",
        const=DEFAULT_PG,
        metavar="URL",
        help="also a ctrlrun proxy on a PostgreSQL ledger: a throwaway database made on this "
        f"loopback server and dropped at the end (default {DEFAULT_PG})",
    )
    add(
        "--sustain",
        type=float,
        metavar="S",
        help="then protected writes at 1 connection for S seconds per target, and their tail",
    )
    add(
        "--sustain-requests",
        type=int,
        default=500_000,
        help="cap of one sustained run (default 500000)",
    )
    add("--profile", action="store_true", help="then profile ctrlrun proxy under writes")
    add(
        "--profile-reads",
        action="store_true",
        help="profile it under pass-through reads instead (with --profile)",
    )
    add(
        "--profile-pg",
        action="store_true",
        help="profile the PostgreSQL one under writes instead (with --profile --postgres)",
    )
    add("--profile-seconds", type=float, default=10.0, help="(default 10)")
    add("--top", type=int, default=25, help="profile rows per table (default 25)")
    add("--keep", action="store_true", help="keep the work directory (logs, ledger)")
    add("--json", action="store_true", help="print one JSON object instead of lines")
    args = ap.parse_args(argv)
    if args.max_seconds is None:
        args.max_seconds = 150.0 + (70.0 if args.baseline else 0) + (40.0 if args.postgres else 0)
    if min(args.rounds, args.requests, args.latency_requests, args.connections) < 1:
        ap.error("counts must be positive")
    if args.sustain is not None and not 0 < args.sustain <= MAX_SUSTAIN_SECONDS:
        ap.error(f"--sustain takes 0 < S <= {MAX_SUSTAIN_SECONDS:.0f} seconds")
    if args.profile_pg and args.postgres is None:
        ap.error("--profile-pg needs --postgres")
    if args.sustain_requests < 1:
        ap.error("--sustain-requests must be positive")
    if args.postgres is not None:
        try:
            check_loopback(args.postgres)
        except (ValueError, ArgumentError) as exc:
            ap.error(f"--postgres: {exc}")

    def say(*parts: object) -> None:
        if not args.json:
            print(*parts, flush=True)

    load = os.getloadavg()
    out: dict[str, Any] = {
        "load_average": [round(x, 2) for x in load],
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
    }
    say(
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs, "
        f"python {out['python']}"
    )
    workdir = Path(tempfile.mkdtemp(prefix="ctrlrun-bench-proxy-"))
    children: list[Child] = []
    started = time.monotonic()
    # Ctrl-C and SIGTERM both end up in the cleanup below (SIGINT too when it came in ignored).
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in STOP_SIGNALS}
    dbs: Databases | None = None
    try:
        pg_url = None
        if args.postgres is not None:
            dbs = Databases(args.postgres)
            pg_url = dbs.create("proxy")
        targets = start(
            workdir, children, say, args.baseline, pg_store_url(pg_url) if pg_url else None
        )
        by_name = {t.name: t for t in targets}
        requests = Requests(f"{os.getpid():x}{int(time.time()) % 100000:x}")
        say(
            f"throughput: {args.connections} keep-alive connections, median of {args.rounds} "
            f"runs of {args.requests}; latency: 1 connection, {args.rounds} x "
            f"{args.latency_requests} requests pooled"
        )
        if not measure(targets, requests, args):
            out["truncated"] = True
        out["figures"] = fig = {t.name: t.summary() for t in targets}
        out["goals"] = goals(fig)
        out["baseline"] = against_baseline(fig)
        direct = fig["direct_write"]["req_per_s"]
        plain = max(fig["mitmdump_write"]["req_per_s"] or 0, fig["mitmdump_read"]["req_per_s"] or 0)
        out["loadgen_headroom"] = direct / plain if direct and plain else None
        if pg_url is not None:
            out["pg_floor"] = commit_pairs(pg_url)
        if args.sustain is not None:
            names = ("mitmdump_write", "ctrlrun_write", "pg_write")
            load = [by_name[n] for n in names if n in by_name]
            out["sustain"] = sustain(load, requests, args.sustain, args.sustain_requests)
        proxies = [n.removesuffix("_write") for n in by_name if n.endswith("_write")]
        proxies = [n for n in proxies if n not in ("direct", "mitmdump")]
        out["ledgers"] = {
            name: pg_ledger_counts(pg_url)
            if name == "pg"
            else ledger_counts(workdir / f"{name}-state.db")
            for name in proxies
        }
        out["writes_answered"] = {name: by_name[f"{name}_write"].answered for name in proxies}
        report(out, targets, say)
        if out.get("truncated"):
            say(
                f"NOTE: the {args.max_seconds:.0f} s budget ran out; some figures have fewer rounds"
            )
        if "pg_floor" in out:
            report_floor(out["pg_floor"], say)
        if "sustain" in out:
            report_sustain(out["sustain"], args.sustain, say)
        if args.profile:
            name = "ctrlrun_read" if args.profile_reads else "ctrlrun_write"
            if args.profile_pg:
                name = "pg_write"
            out["profile"] = profile(by_name[name], requests, args, workdir)
            report_profile(out["profile"], say)
    except KeyboardInterrupt:
        print("\nbench_proxy: interrupted; stopping the child processes", file=sys.stderr)
        return 130
    except (BenchError, ChildError, SustainError, sqlite3.Error, *db_errors()) as exc:
        print(f"bench_proxy: {exc}", file=sys.stderr)
        return 1
    finally:
        if dbs is not None:
            for child in reversed(children):  # their connections first, then the database
                child.stop()
            for left in dbs.drop_all():
                print(f"bench_proxy: could not drop {left}", file=sys.stderr)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for child in reversed(children):
            child.stop()
        if args.keep:
            print(f"work directory kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    out["seconds"] = round(time.monotonic() - started, 1)
    say(f"\ndone in {out['seconds']:.0f} s")
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
