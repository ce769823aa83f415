"""One benchmark worker: times ``@protect`` calls for whichever ``ctrlrun`` its interpreter imports.

``bench_protect.py`` starts one of these under this repository's interpreter and one under the
reference venv's (both distributions are imported as ``ctrlrun``, so they cannot share a
process), then drives both with the same JSON-line commands on stdin, so that the two are
timed by the same code, round by round. Standard library only: it must run in the reference
venv, where nothing of this repository is importable.

The store is a fresh SQLite file in a temporary directory, or, when the environment has
``BENCH_PROTECT_STORE={"kind": "postgres", "url": U}`` (JSON; the environment rather than the
command line, so a password in ``U`` is not on every ``ps``), the database ``U`` names, through
whichever ``PostgresStateStore`` this distribution has. Its ``ready`` reply names the store's
durability settings as its own connection reports them (``pragmas``).

Commands (one JSON object per line) and replies (one JSON object per line on stdout):

    {"op": "sync",    "calls": N, "max_seconds": S}  -> {"calls": n, "seconds": t, "cpu_seconds": c}
    {"op": "dup",     "calls": N, "max_seconds": S}  -> {"calls": n, "seconds": t, "cpu_seconds": c}
    {"op": "async",   "calls": N, "tasks": T, "max_seconds": S, "mode": "native"|"to_thread"}
    {"op": "profile", "calls": N, "top": K}          -> {"cumulative": "...", "tottime": "..."}
    {"op": "quit"}

Every op is bounded by its call count and by ``max_seconds``; a reply names how many calls
actually ran. A failure is ``{"error": "..."}``; the worker keeps serving.
"""

from __future__ import annotations

import asyncio
import cProfile
import importlib
import io
import json
import os
import pstats
import signal
import sys
import tempfile
import time
import traceback
from typing import Any

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  bench.write:
    effect: "w:{n}"
    decision: allow
"""

STORE_ENV = "BENCH_PROTECT_STORE"
SQLITE_PRAGMAS = ("journal_mode", "synchronous", "busy_timeout")
POSTGRES_SETTINGS = ("synchronous_commit", "default_transaction_isolation", "server_version")

# The protocol owns the real stdout; anything the library prints goes to stderr instead.
_OUT = sys.stdout
sys.stdout = sys.stderr


def _write(n: int) -> int:
    return n


async def _async_write(n: int) -> int:
    return n


def open_store(ctrlrun: Any, store: dict[str, Any]) -> Any:
    """``{"kind": "sqlite", "path": P}`` or ``{"kind": "postgres", "url": U}``, opened."""
    if store["kind"] == "sqlite":
        return ctrlrun.SQLiteStateStore(store["path"])
    # Ours exports it; the reference keeps it in ``ctrlrun.postgres`` (``[postgres]``).
    cls = getattr(ctrlrun, "PostgresStateStore", None)
    if cls is None:
        cls = importlib.import_module("ctrlrun.postgres").PostgresStateStore
    return cls(store["url"])


class Bench:
    """One store, one Control, the protected functions, and a counter handing out fresh keys."""

    def __init__(self, workdir: str, store: dict[str, Any]) -> None:
        # Whichever distribution this interpreter has: this repository's or the reference.
        ctrlrun: Any = importlib.import_module("ctrlrun")
        Control, Policy, protect = ctrlrun.Control, ctrlrun.Policy, ctrlrun.protect

        self.ctrlrun = ctrlrun
        policy_path = os.path.join(workdir, "ctrlrun.yaml")
        with open(policy_path, "w", encoding="utf-8") as fh:
            fh.write(POLICY)
        self.kind = store["kind"]
        self.store = open_store(ctrlrun, store)
        self.control = Control(Policy.from_file(policy_path), self.store)
        self.next_n = 0

        # The same decorator call as ``@protect(...)`` on the ``def``, spelled as a call.
        decorate = protect("bench.write", effect="w:{n}", control=self.control)
        self.write: Any = decorate(_write)
        self.async_write: Any = None
        self.async_refusal: str | None = None
        try:
            self.async_write = decorate(_async_write)
        except Exception as exc:  # the reference refuses `async def` at decoration time
            self.async_refusal = f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
        # One committed key that every "dup" call collides with.
        self.dup_n = -1
        with ctrlrun.context(agent="bench"):
            self.write(self.dup_n)

    def fresh(self) -> int:
        n = self.next_n
        self.next_n += 1
        return n

    def info(self) -> dict[str, Any]:
        version = getattr(self.ctrlrun, "__version__", None)
        if version is None:
            from importlib.metadata import version as dist_version

            version = dist_version("ctrlrun")
        return {
            "version": version,
            "module": os.path.dirname(self.ctrlrun.__file__),
            "python": sys.version.split()[0],
            "pragmas": self.pragmas(),
            "async": "native" if self.async_write is not None else None,
            "async_refusal": self.async_refusal,
        }

    def pragmas(self) -> dict[str, Any]:
        """The durability settings as the store's own connection reports them."""
        if self.kind == "sqlite":
            names, query = SQLITE_PRAGMAS, "PRAGMA {}"
        else:
            names, query = POSTGRES_SETTINGS, "SHOW {}"
        engine = getattr(self.store, "engine", None)
        if engine is not None:  # this repository: SQLAlchemy, pragmas set on connect
            with engine.connect() as conn:
                return {p: conn.exec_driver_sql(query.format(p)).scalar() for p in names}
        # The reference: one sqlite3 (or autocommit psycopg) connection per thread.
        conn = self.store._connection()
        return {p: conn.execute(query.format(p)).fetchone()[0] for p in names}

    # -- ops ---------------------------------------------------------------------------------

    def sync(self, calls: int, max_seconds: float) -> dict[str, Any]:
        write, done = self.write, 0
        with self.ctrlrun.context(agent="bench"):
            cpu, start = time.process_time(), time.perf_counter()
            deadline = start + max_seconds
            while done < calls:
                write(self.fresh())
                done += 1
                if done % 50 == 0 and time.perf_counter() > deadline:
                    break
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        return {"calls": done, "seconds": elapsed, "cpu_seconds": cpu}

    def dup(self, calls: int, max_seconds: float) -> dict[str, Any]:
        write, dup_n, done = self.write, self.dup_n, 0
        duplicate = self.ctrlrun.DuplicateEffect
        with self.ctrlrun.context(agent="bench"):
            cpu, start = time.process_time(), time.perf_counter()
            deadline = start + max_seconds
            while done < calls:
                try:
                    write(dup_n)
                except duplicate:
                    pass
                else:
                    raise RuntimeError("a duplicate call was not refused")
                done += 1
                if done % 50 == 0 and time.perf_counter() > deadline:
                    break
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        return {"calls": done, "seconds": elapsed, "cpu_seconds": cpu}

    def run_async(self, calls: int, tasks: int, max_seconds: float, mode: str) -> dict[str, Any]:
        if mode == "native":
            if self.async_write is None:
                return {"unsupported": self.async_refusal}
            fn = self.async_write
        else:  # the reference's own advice for async callers: a sync executor on a thread
            sync_write = self.write

            async def fn(n: int) -> int:
                return await asyncio.to_thread(sync_write, n)

        counter = {"done": 0, "issued": 0}

        async def worker(deadline: float) -> None:
            while counter["issued"] < calls and time.perf_counter() < deadline:
                counter["issued"] += 1
                await fn(self.fresh())
                counter["done"] += 1

        async def main() -> float:
            with self.ctrlrun.context(agent="bench"):  # tasks copy the context when created
                start = time.perf_counter()
                await asyncio.gather(*(worker(start + max_seconds) for _ in range(tasks)))
                return time.perf_counter() - start

        cpu = time.process_time()
        elapsed = asyncio.run(main())
        cpu = time.process_time() - cpu
        return {"calls": counter["done"], "seconds": elapsed, "cpu_seconds": cpu, "tasks": tasks}

    def profile(self, calls: int, top: int) -> dict[str, Any]:
        write = self.write
        profiler = cProfile.Profile()
        with self.ctrlrun.context(agent="bench"):
            profiler.enable()
            for _ in range(calls):
                write(self.fresh())
            profiler.disable()
        out: dict[str, Any] = {"calls": calls}
        for order in ("cumulative", "tottime"):
            buf = io.StringIO()
            stats = pstats.Stats(profiler, stream=buf)
            stats.strip_dirs().sort_stats(order).print_stats(top)
            out[order] = buf.getvalue()
        return out


def reply(obj: dict[str, Any]) -> None:
    _OUT.write(json.dumps(obj) + "\n")
    _OUT.flush()


def _interrupted(signum: int, frame: Any) -> None:
    # Ctrl-C reaches this worker from the terminal and again from bench_protect.py: the first
    # one stops it, a second must not cut short the removal of its temporary directory.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def main() -> int:
    signal.signal(signal.SIGINT, _interrupted)
    with tempfile.TemporaryDirectory(prefix="ctrlrun-bench-") as workdir:
        try:
            given = os.environ.get(STORE_ENV)
            store = json.loads(given) if given else {"kind": "sqlite"}
            if store["kind"] == "sqlite":
                store.setdefault("path", os.path.join(workdir, "state.db"))
            bench = Bench(workdir, store)
            reply({"ready": bench.info()})
        except Exception:
            reply({"error": traceback.format_exc(limit=6)})
            return 1
        for line in sys.stdin:
            cmd = json.loads(line)
            op = cmd.get("op")
            try:
                if op == "quit":
                    reply({"bye": True})
                    break
                if op == "sync":
                    reply(bench.sync(int(cmd["calls"]), float(cmd["max_seconds"])))
                elif op == "dup":
                    reply(bench.dup(int(cmd["calls"]), float(cmd["max_seconds"])))
                elif op == "async":
                    reply(
                        bench.run_async(
                            int(cmd["calls"]),
                            int(cmd["tasks"]),
                            float(cmd["max_seconds"]),
                            str(cmd["mode"]),
                        )
                    )
                elif op == "profile":
                    reply(bench.profile(int(cmd["calls"]), int(cmd.get("top", 25))))
                else:
                    reply({"error": f"unknown op {op!r}"})
            except Exception:
                reply({"error": traceback.format_exc(limit=6)})
        bench.store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
