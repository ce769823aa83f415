"""The two reads people run on a big ledger, timed as a CLI subprocess and as a library call.

``ctrlrun receipts --last 20`` is ``views.timeline(conn, 20)`` and ``ctrlrun effects --state
ambiguous`` is ``ledger.list_effects(conn, EffectState.AMBIGUOUS)``; each is timed both ways,
and the SQL the library call sent (captured from the engine, so it is exactly what runs) is
explained: ``EXPLAIN QUERY PLAN`` on SQLite, ``EXPLAIN (ANALYZE, BUFFERS)`` on PostgreSQL.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, event

from ctrlrun import ledger, views
from ctrlrun.states import EffectState
from ctrlrun.store import open_store

QUERIES: dict[str, tuple[list[str], Callable[[Connection], list[Any]]]] = {
    "receipts --last 20": (["receipts", "--last", "20"], lambda conn: views.timeline(conn, 20)),
    "effects --state ambiguous": (
        ["effects", "--state", "ambiguous"],
        lambda conn: ledger.list_effects(conn, EffectState.AMBIGUOUS),
    ),
}


@dataclass
class QueryFigure:
    """One query on one backend: library and CLI wall times (seconds), rows, and plans."""

    query: str
    backend: str
    library_s: float
    library_range: tuple[float, float]
    cli_s: float | None
    cli_range: tuple[float, float] | None
    cli_cpu_s: float | None
    rows: int
    cli_lines: int | None
    plans: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


def cli_command() -> list[str]:
    """The installed ``ctrlrun`` script beside this interpreter, else ``python -m ctrlrun.cli``."""
    script = Path(sys.executable).with_name("ctrlrun")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ctrlrun.cli"]


def _env() -> dict[str, str]:
    # No deployment settings: the store is named on the command line.
    return {k: v for k, v in os.environ.items() if not k.startswith("CTRLRUN_")}


def time_cli(
    args: list[str], *, runs: int, timeout: float, cwd: str
) -> tuple[list[float], list[float], str]:
    """Wall and CPU (user + system) times of ``runs`` runs after one untimed; the last stdout."""
    times: list[float] = []
    cpus: list[float] = []
    out = ""
    for i in range(runs + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(
            cli_command() + args,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_env(),
            cwd=cwd,
        )
        elapsed = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if done.returncode != 0:
            raise RuntimeError(
                f"ctrlrun {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-300:]}"
            )
        out = done.stdout
        if i:
            times.append(elapsed)
            cpus.append(cpu)
    return times, cpus, out


def cli_startup(*, runs: int, timeout: float, cwd: str) -> tuple[list[float], list[float]]:
    """``ctrlrun --version``: the interpreter, click and the package imports, no ledger."""
    times, cpus, _ = time_cli(["--version"], runs=runs, timeout=timeout, cwd=cwd)
    return times, cpus


def measure(
    store_url: str, backend: str, *, runs: int, timeout: float, cwd: str, cli: bool = True
) -> list[QueryFigure]:
    """Every query in ``QUERIES`` on the ledger at ``store_url``."""
    figures: list[QueryFigure] = []
    store = open_store(store_url, create=False)
    statements: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cur: Any, statement: str, params: Any, _ctx: Any, _many: bool) -> None:
        words = statement.upper().split()
        if words[:1] == ["SELECT"] and "FROM" in words:
            statements.append((statement, params))

    try:
        for name, (args, call) in QUERIES.items():
            times: list[float] = []
            rows: list[Any] = []
            for i in range(runs + 1):
                if i == runs:
                    statements.clear()
                    event.listen(store.engine, "before_cursor_execute", capture)
                start = time.perf_counter()
                with store.reading() as conn:
                    rows = call(conn)
                elapsed = time.perf_counter() - start
                if i:
                    times.append(elapsed)
            event.remove(store.engine, "before_cursor_execute", capture)
            with store.reading() as conn:
                plans = [
                    {"sql": " ".join(sql.split()), "plan": explain(conn, sql, params)}
                    for sql, params in statements
                ]
            fig = QueryFigure(
                name,
                backend,
                statistics.median(times),
                (min(times), max(times)),
                None,
                None,
                None,
                len(rows),
                None,
                plans,
            )
            if cli:
                try:
                    ctimes, cpus, out = time_cli(
                        [*args, "--store-url", store_url], runs=runs, timeout=timeout, cwd=cwd
                    )
                    fig.cli_s = statistics.median(ctimes)
                    fig.cli_cpu_s = statistics.median(cpus)
                    fig.cli_range = (min(ctimes), max(ctimes))
                    fig.cli_lines = len(out.splitlines())
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    fig.error = str(exc)
            figures.append(fig)
    finally:
        store.close()
    return figures


def explain(conn: Connection, sql: str, params: Any) -> list[str]:
    if conn.dialect.name == "sqlite":
        rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params).all()
        # (id, parent, notused, detail): indent each step under its parent.
        depth: dict[int, int] = {0: 0}
        lines = []
        for node, parent, _, detail in rows:
            depth[node] = depth.get(parent, 0) + 1
            lines.append("  " * (depth[node] - 1) + str(detail))
        return lines
    rows = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {sql}", params).all()
    return [str(r[0]) for r in rows]
