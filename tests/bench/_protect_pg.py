"""``bench_protect.py --postgres``: both distributions on PostgreSQL, each in a throwaway database.

``PgSide`` makes ``ctrlrun_bench_<pid>_ours`` (and ``_theirs`` when the reference can run:
psycopg installed into its venv at this interpreter's version) on a loopback server, plus
``_floor``, where it measures one durable commit (``INSERT`` + ``COMMIT``), the floor any
transaction of a protected call pays on this server. ``close()`` drops them ``WITH (FORCE)``
whatever happened. ``_ledger_pg.Databases`` does the creating, dropping and measuring.
A server that is not there, or a psycopg that is missing, is one line and no PostgreSQL figures.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import _ledger_pg as pg

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
OURS, THEIRS = "ours pg", "theirs pg"


def url_problem(url: str) -> str | None:
    """Why ``url`` is not a PostgreSQL server on this host, or None."""
    from sqlalchemy.exc import ArgumentError

    try:
        pg.check_loopback(url)
    except (ValueError, ArgumentError) as exc:
        return str(exc)
    return None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


class PgSide:
    """This run's PostgreSQL databases, the stores the workers open on them, and the floor."""

    def __init__(self, url: str) -> None:
        self.url = url
        parsed = pg.check_loopback(url)
        self.server = f"{parsed.host}:{parsed.port or 5432}"  # for lines people read
        self.dbs: pg.Databases | None = None
        self.stores: dict[str, dict[str, Any]] = {}  # worker label -> its store
        self.floor_s: float | None = None
        self.out: dict[str, Any] = {"measured": False, "server": self.server}

    def open(self, ref_python: str | None, say: Callable[..., None]) -> bool:
        """Create the databases and measure the floor; False (and one line said) if not."""
        try:
            self.dbs = pg.Databases(self.url)
            if ref_python is not None:
                ok, note = pg.reference_psycopg(ref_python, timeout=180)
                self.out["reference_psycopg"] = note
                if ok:
                    say(f"reference on PostgreSQL: {note}")
                else:
                    say(f"reference on PostgreSQL: NOT MEASURED — {note}")
                    ref_python = None
            self.stores[OURS] = {"kind": "postgres", "url": pg.libpq(self.dbs.create("ours"))}
            if ref_python is not None:
                theirs = pg.libpq(self.dbs.create("theirs"))
                self.stores[THEIRS] = {"kind": "postgres", "url": theirs}
            self.floor_s = self.dbs.commit_floor(self.dbs.create("floor"))
        except Exception as exc:  # no server, no psycopg, no rights: say so, measure SQLite
            why = first_line(exc)
            self.out["why"] = why
            say(f"PostgreSQL at {self.server}: NOT MEASURED — {why}")
            self.close()
            self.stores = {}
            return False
        self.out.update(
            measured=True,
            databases=list(self.dbs.created),
            commit_floor_us=self.floor_s * 1e6,
        )
        say(
            f"PostgreSQL: databases {', '.join(self.out['databases'])} on {self.server}; "
            f"one durable commit here (INSERT + COMMIT, median of 200): "
            f"{self.floor_s * 1e6:.0f} µs"
        )
        return True

    def floor_line(self, fig: dict[str, Any]) -> str | None:
        """How many durable commits each side's allowed call costs on this server."""
        if not self.floor_s:
            return None
        floor_us = self.floor_s * 1e6
        times = {n: fig[n]["us_per_call"] / floor_us for n in (OURS, THEIRS) if fig.get(n)}
        if not times:
            return None
        self.out["allow_in_commits"] = {n.removesuffix(" pg"): t for n, t in times.items()}
        parts = ", ".join(f"{t:.1f}x that ({n})" for n, t in times.items())
        return f"  {'floor':>9}: one durable commit here {floor_us:.0f} µs; an allowed call {parts}"

    def close(self) -> None:
        """Drop every database this run made (the workers must be gone first)."""
        if self.dbs is None:
            return
        for left in self.dbs.drop_all():
            print(f"bench_protect: could not drop {left}", file=sys.stderr)
        self.dbs = None
