"""Helpers shared by the kernel tests (imported by conftest.py and the test modules)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text

from ctrlrun import SQLiteStateStore
from ctrlrun.action import utc_now

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  refund:
    effect: "refund:{payment_id}"
    rules:
      - when: {amount_lte: 10000}
        decision: allow
      - decision: approve
  scale:
    effect: "scale:{cluster}:{deployment}:{replicas}"
    window: 10m
    decision: allow
  wire:
    effect: "wire:{wire_id}"
    decision: approve
  delete:
    effect: "delete:{name}"
    decision: deny
  note:
    decision: allow
"""


class Clock:
    """A clock the test moves by hand; starts at the real time so the CLI agrees on expiry."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or utc_now()

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


def monotonic_follows(clock: Clock, monkeypatch: Any) -> None:
    """Time passes with ``clock``: the monotonic clock a window is also measured on
    (``steady.monotonic``) moves as the fake wall clock does, as real time would."""
    from ctrlrun import steady

    base, origin = steady.monotonic(), clock.now
    monkeypatch.setattr(steady, "monotonic", lambda: base + (clock.now - origin).total_seconds())


@dataclass
class Ran:
    """A finished subprocess."""

    code: int
    out: str
    err: str


def run_cli(
    args: Sequence[str], cwd: Path, *, timeout: float = 30, env: dict[str, str] | None = None
) -> Ran:
    """Run ``python -m ctrlrun.cli ARGS`` in ``cwd`` and check that no traceback escaped."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CTRLRUN_")}
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "ctrlrun.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return Ran(proc.returncode, proc.stdout, proc.stderr)


def events(
    store: SQLiteStateStore, effect_key: str | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """(type, data) of every event, in order; only those of ``effect_key`` when given."""
    sql = "SELECT type, data_json FROM events"
    params: dict[str, Any] = {}
    if effect_key is not None:
        sql += " WHERE effect_key = :k"
        params["k"] = effect_key
    with store.reading() as conn:
        rows = conn.execute(text(sql + " ORDER BY event_id"), params).all()
    return [(t, json.loads(d)) for t, d in rows]


def receipts(store: SQLiteStateStore) -> list[dict[str, Any]]:
    """Every receipt document, in chain order."""
    with store.reading() as conn:
        rows = conn.execute(text("SELECT json FROM receipts ORDER BY seq")).all()
    return [json.loads(r[0]) for r in rows]


PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"


def postgres_reachable() -> bool:
    try:
        import psycopg
    except ImportError:
        return False
    try:
        psycopg.connect(PG_ADMIN, connect_timeout=2).close()
    except psycopg.Error:
        return False
    return True


def run_parallel(code: str, args: Sequence[Sequence[str]], *, timeout: float = 60) -> list[Ran]:
    """Start one ``python -c CODE ARGS...`` per entry of ``args`` at once; wait for all."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, *a],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for a in args
    ]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append(Ran(p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def invoke(args: Sequence[str], cwd: Path, *, env: dict[str, str] | None = None) -> Ran:
    """``run_cli`` in-process (click's runner): the same checks, a fraction of the time."""
    from click.testing import CliRunner

    from ctrlrun.cli import main

    full_env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("CTRLRUN_")}
    full_env.update(env or {})
    before = Path.cwd()
    os.chdir(cwd)
    try:
        result = CliRunner(env=full_env).invoke(main, list(args))
    finally:
        os.chdir(before)
    # An expected error leaves through sys.exit; anything else is a traceback for the user.
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"ctrlrun {' '.join(args)} raised") from result.exception
    return Ran(result.exit_code, result.stdout, result.stderr)
