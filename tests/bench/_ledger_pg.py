"""Throwaway PostgreSQL databases for ``bench_ledger.py``, and psycopg in the reference venv.

Every database this creates is named ``ctrlrun_bench_<pid>_<label>`` and dropped by
``Databases.drop_all`` (``WITH (FORCE)``: a worker that died holding a connection must not
leave it behind). Only loopback servers are accepted.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import time
from typing import Any

from sqlalchemy.engine import URL, make_url

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def check_loopback(url: str) -> URL:
    """The parsed URL, or ``ValueError`` unless it names a PostgreSQL server on this host."""
    parsed = make_url(url)
    if parsed.drivername.split("+")[0] not in ("postgresql", "postgres"):
        raise ValueError(f"not a PostgreSQL URL: {parsed.drivername}://…")
    if parsed.host not in LOOPBACK:
        raise ValueError(f"only a server on 127.0.0.1 is used, not {parsed.host!r}")
    return parsed


def libpq(url: URL) -> str:
    """The URL as libpq (and the reference's ``PostgresStateStore``) spells it."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


class Databases:
    """Creates and drops this run's databases on one server."""

    def __init__(self, admin_url: str) -> None:
        import psycopg

        self.admin = check_loopback(admin_url)
        self.created: list[str] = []
        self._psycopg = psycopg
        with self._connect() as conn:  # fail here, early, if the server is not there
            conn.execute("SELECT 1")

    def _connect(self) -> Any:
        return self._psycopg.connect(libpq(self.admin), autocommit=True, connect_timeout=5)

    def create(self, label: str) -> URL:
        name = f"ctrlrun_bench_{os.getpid()}_{label}".lower()
        with self._connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return self.admin.set(database=name)

    def checkpoint(self) -> str | None:
        """Flush a bulk load's dirty buffers now, not during the measurement; None if done."""
        try:
            with self._connect() as conn:
                conn.execute("CHECKPOINT")
        except Exception as exc:  # needs pg_checkpoint or superuser: say so, carry on
            return str(exc).strip().splitlines()[0]
        return None

    def commit_floor(self, url: URL, *, commits: int = 200, max_seconds: float = 20.0) -> float:
        """Median seconds of one durable commit (a one-row INSERT) on this server, now.

        What a ledger cannot go below per transaction with ``synchronous_commit = on``: the
        server's WAL flush. Measured in a throwaway table of a throwaway database.
        """
        times: list[float] = []
        with self._psycopg.connect(libpq(url), connect_timeout=5) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS bench_commit_floor (n int)")
            conn.commit()
            deadline = time.monotonic() + max_seconds
            for n in range(commits):
                start = time.perf_counter()
                conn.execute("INSERT INTO bench_commit_floor VALUES (%s)", (n,))
                conn.commit()
                times.append(time.perf_counter() - start)
                if time.monotonic() > deadline:
                    break
        times.sort()
        return times[len(times) // 2]

    def stats(self) -> dict[str, dict[str, int]]:
        """``pg_stat_database`` counters of this run's databases, by name."""
        cols = (
            "xact_commit",
            "xact_rollback",
            "tup_inserted",
            "tup_updated",
            "tup_fetched",
            "blks_read",
            "blks_hit",
        )
        with self._connect() as conn:
            rows = conn.execute(
                f"SELECT datname, {', '.join(cols)} FROM pg_stat_database WHERE datname = ANY(%s)",
                (self.created,),
            ).fetchall()
        return {r[0]: dict(zip(cols, (int(v) for v in r[1:]), strict=True)) for r in rows}

    def drop_all(self) -> list[str]:
        """Drop every database this run created; returns the ones that could not be dropped."""
        left: list[str] = []
        for name in self.created:
            try:
                with self._connect() as conn:
                    conn.execute("SET lock_timeout = '10s'")
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except Exception as exc:  # report it; never stop the other drops
                left.append(f"{name}: {exc}")
        self.created = []
        return left


def reference_psycopg(python: str, timeout: float) -> tuple[bool, str]:
    """Make sure the reference venv can import psycopg (``ctrlrun[postgres]``): (ok, note).

    It gets the version this interpreter has, so both sides use the same driver.
    """
    probe = [python, "-I", "-c", "import psycopg; print(psycopg.__version__)"]
    found = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    if found.returncode == 0:
        return True, f"psycopg {found.stdout.strip()} already there"
    try:
        version = importlib.metadata.version("psycopg")
    except importlib.metadata.PackageNotFoundError:
        version = None
    spec = f"psycopg[binary]=={version}" if version else "psycopg[binary]"
    started = time.monotonic()
    try:
        done = subprocess.run(
            [python, "-m", "pip", "install", "--disable-pip-version-check", "-q", spec],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return False, f"`pip install {spec}` took longer than {timeout:.0f} s"
    if done.returncode != 0:
        lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        return False, f"`pip install {spec}` failed: {' | '.join(lines[-3:])}"
    if subprocess.run(probe, capture_output=True, timeout=60).returncode != 0:
        return False, f"{spec} installed but psycopg does not import in the reference venv"
    return True, f"installed {spec} in {time.monotonic() - started:.1f} s"
