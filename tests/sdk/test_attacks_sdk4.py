"""Ways around ``@ctrlrun.protect`` across processes on one host: a wall-clock step between
a running call's renewals, a holder killed at each step, and two processes on one key.

Every holder is a real subprocess on the same ledger file (or PostgreSQL database); the
executions are counted by the functions themselves (one ``O_APPEND`` line per run), never by
the ledger.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sdk_support import run_cli

from ctrlrun import (
    Control,
    CTRLRunError,
    DuplicateEffect,
    InvalidArgument,
    NotExecuted,
    Policy,
    SQLiteStateStore,
    context,
    protect,
)
from ctrlrun import ledger as L
from ctrlrun.store import StateStore, open_store

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  refund:
    effect: "refund:{payment_id}"
    decision: allow
"""

# A holder: reserve refund:p1 under a 3 s lease (renewed every second while the function
# runs), say it is inside, wait for the test's go, return. Prints how its call ended.
HOLDER = """\
import os, sys, time
from datetime import timedelta
import ctrlrun
from ctrlrun import Control, Policy
from ctrlrun.store import open_store

policy, url, runs, inside, go = sys.argv[1:6]
control = Control(Policy.from_file(policy), open_store(url))

@ctrlrun.protect("refund", lease=timedelta(seconds=3), control=control)
def refund(payment_id: str, amount: int) -> str:
    fd = os.open(runs, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, b"holder\\n")
    os.close(fd)
    open(inside, "w").write(str(os.getpid()))
    deadline = time.monotonic() + 30
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.02)
    return "done"

with ctrlrun.context(agent="holder"):
    try:
        print(refund(payment_id="p1", amount=100))
    except ctrlrun.CTRLRunError as exc:
        print(type(exc).__name__)
"""


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CTRLRUN_")}


class Holder:
    """A holder subprocess, stopped inside its function until ``finish``."""

    def __init__(self, tmp_path: Path, url: str) -> None:
        self.policy = tmp_path / "ctrlrun.yaml"
        self.policy.write_text(POLICY)
        self.runs, self.inside, self.go = (tmp_path / n for n in ("runs", "inside", "go"))
        args = [str(p) for p in (self.policy, url, self.runs, self.inside, self.go)]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_clean_env(),
        )

    def wait_inside(self) -> None:
        deadline = time.monotonic() + 30
        while not (self.inside.exists() and self.inside.read_text()):
            assert self.proc.poll() is None, self.proc.communicate()[1]
            assert time.monotonic() < deadline, "the holder never reached its function"
            time.sleep(0.02)

    def finish(self) -> str:
        self.go.write_text("go")
        out, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, err
        return out.strip()

    def ran(self) -> list[str]:
        return self.runs.read_text().split() if self.runs.exists() else []

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=10)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state.db'}"
    pg: str = request.getfixturevalue("pg_url")
    return pg


@pytest.fixture
def ledger_store(url: str) -> Iterator[StateStore]:
    store = open_store(url)
    yield store
    store.close()


def stepped(store: StateStore, seconds: float) -> Callable[[], datetime]:
    """The ledger's clock stepped forward by ``seconds`` (NTP, a resumed VM, the database
    host's own clock): a step, not time going by."""
    return lambda: store.clock() + timedelta(seconds=seconds)


def state(store: StateStore, key: str) -> str:
    with store.reading() as conn:
        rec = L.get_effect(conn, key)
    return "none" if rec is None else rec.state.value


# -- a clock step between a running call's renewals ---------------------------------------


@pytest.mark.timeout(90)
def test_a_clock_step_does_not_hand_a_running_call_in_another_process_to_a_retry(
    tmp_path: Path, url: str, ledger_store: StateStore
) -> None:
    """Process A is inside its function, its 3 s lease renewed every second. The clock
    steps a minute forward; process B retries the key before A's next renewal, with a
    reconciler that (rightly: A has not reached the remote yet) finds nothing. B took A's lease
    as expired, ambiguated A's call, heard not_executed and ran the effect a second time. A
    live holder on this host keeps its lease whatever the wall clock says: B is refused
    in_progress and A commits."""
    holder = Holder(tmp_path, url)
    try:
        holder.wait_inside()
        asked: list[str] = []

        def hook(key: str) -> str:
            asked.append(key)
            return "not_executed"

        control = Control(Policy.from_yaml(POLICY), ledger_store, clock=stepped(ledger_store, 60))

        @protect("refund", reconcile=hook, control=control)
        def refund(payment_id: str, amount: int) -> str:
            fd = os.open(holder.runs, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(fd, b"retry\n")
            os.close(fd)
            return "done"

        with context("retrier"), pytest.raises(DuplicateEffect) as refused:
            refund(payment_id="p1", amount=100)
        assert refused.value.state == "in_progress"
        assert asked == []
        if url.startswith("sqlite"):  # a sweep and a listing in a process whose clock stepped
            step = {"CTRLRUN_CLOCK_OFFSET": "60"}
            swept = run_cli(
                ["reconcile", "--policy", str(holder.policy), "--store-url", url],
                tmp_path,
                env=step,
            )
            assert swept.code == 0, swept.err
            listed = run_cli(["effects", "--store-url", url], tmp_path, env=step)
            assert "refund:p1  executing  attempt 1" in listed.out, listed.out
        assert holder.finish() == "done"
    finally:
        holder.stop()
    assert holder.ran() == ["holder"]
    assert state(ledger_store, "refund:p1") == "committed"


def _state_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def _retry(store: StateStore, step: float) -> str:
    """A retry of refund:p1 on the ledger's clock stepped by ``step``; how it ended."""
    control = Control(Policy.from_yaml(POLICY), store, clock=stepped(store, step))

    @protect("refund", reconcile=lambda key: "unknown", control=control)
    def refund(payment_id: str, amount: int) -> str:
        return "ran"

    with context("retrier"):
        try:
            return refund(payment_id="p1", amount=100)
        except CTRLRunError as exc:
            return type(exc).__name__ + ":" + getattr(exc, "state", "")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("reaped", [True, False], ids=["dead", "zombie"])
def test_a_killed_holder_is_judged_on_the_ledger_clock_even_before_it_is_reaped(
    tmp_path: Path, reaped: bool
) -> None:
    """A holder SIGKILLed inside its function does nothing more: after a step past its lease
    the retry ambiguates the key at once, also while the dead process is a zombie (its pid
    and start time still in /proc)."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    holder = Holder(tmp_path, url)
    store = open_store(url)
    try:
        holder.wait_inside()
        holder.proc.send_signal(signal.SIGKILL)
        if reaped:
            holder.proc.wait(10)
        else:
            deadline = time.monotonic() + 10
            while _state_of(holder.proc.pid) != "Z":
                assert time.monotonic() < deadline
                time.sleep(0.01)
        assert _retry(store, 60) == "AmbiguousEffect:"
    finally:
        holder.stop()
        store.close()
    assert holder.ran() == ["holder"]


@pytest.mark.timeout(60)
def test_a_frozen_holder_keeps_its_lease_only_until_it_runs_out_in_real_time(
    tmp_path: Path,
) -> None:
    """A live holder that stops renewing (SIGSTOP: a paused container, a debugger) keeps the
    key across a clock step only until its lease runs out on the monotonic clock; then the
    retry ambiguates it, and the holder, resumed, cannot commit over that."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    holder = Holder(tmp_path, url)
    store = open_store(url)
    try:
        holder.wait_inside()
        holder.proc.send_signal(signal.SIGSTOP)
        assert _retry(store, 60) == "DuplicateEffect:in_progress"
        time.sleep(3.5)  # the 3 s lease, renewed at most a second ago, runs out
        assert _retry(store, 60) == "AmbiguousEffect:"
        holder.proc.send_signal(signal.SIGCONT)
        assert holder.finish() == "done"  # it ran; the ledger says it may have
        assert state(store, "refund:p1") == "ambiguous"
    finally:
        holder.stop()
        store.close()
    assert holder.ran() == ["holder"]


# -- the ledger refuses the outcome of a call that raised -----------------------------------


def _refuse_outcomes(db: Path) -> None:
    """From now on the ledger refuses to move any effect record (as a full or read-only disk
    refuses every write), by a trigger written from another connection."""
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TRIGGER refuse_outcome BEFORE UPDATE ON effects "
            "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
        )


@pytest.mark.parametrize("kind", ["def", "async def"])
@pytest.mark.parametrize(
    "raised", [KeyboardInterrupt, SystemExit, NotExecuted, ValueError], ids=lambda e: e.__name__
)
def test_a_ledger_that_cannot_record_the_outcome_never_masks_the_functions_exception(
    tmp_path: Path,
    kind: str,
    raised: type[BaseException],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The function raised (Ctrl-C, ``sys.exit``, ``NotExecuted``, its own error) and the
    ledger then refused the outcome write. The caller got ``StoreError`` instead: a Ctrl-C or
    an exit became an ``Exception`` that an agent's ``except Exception: retry`` loop swallowed
    and went on. The function's own exception propagates; the ledger's failure is one ERROR
    line and a note on it; the record stays executing under its lease (never failed)."""
    db = tmp_path / "state.db"
    store = SQLiteStateStore(db)
    control = Control(Policy.from_yaml(POLICY), store)

    def act(payment_id: str) -> None:
        _refuse_outcomes(db)
        raise raised("the function's own error")

    async def act_async(payment_id: str) -> None:
        act(payment_id)

    fn: Callable[..., Any] = act if kind == "def" else act_async
    refund = protect("refund", control=control)(fn)
    with context("bot"), pytest.raises(raised) as info:
        out = refund(payment_id="p1")
        if kind == "async def":
            asyncio.run(out)
    assert "the function's own error" in str(info.value)
    assert any("could not be recorded" in note for note in getattr(info.value, "__notes__", []))
    assert [r.levelname for r in caplog.records if "could not be recorded" in r.message] == [
        "ERROR"
    ]
    assert state(store, "refund:p1") == "executing"
    store.close()


# -- SIGKILL at every statement of a call ----------------------------------------------------

# A call whose process kills itself (SIGKILL) as the ledger starts its N-th SQL statement
# (BEGIN and COMMIT included), counted by SQLite's own trace callback on every connection.
KILLED_AT = """\
import os, signal, sys
from datetime import timedelta
from sqlalchemy import event
import ctrlrun
from ctrlrun import Control, Policy
from ctrlrun.store import open_store

policy, url, runs, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
store = open_store(url)
control = Control(Policy.from_file(policy), store)
seen = [0]

def trace(sql):
    seen[0] += 1
    if seen[0] == n:
        os.kill(os.getpid(), signal.SIGKILL)

@event.listens_for(store.engine, "checkout")
def _traced(dbapi, record, proxy):
    dbapi.set_trace_callback(trace)

@ctrlrun.protect("refund", lease=timedelta(seconds=2), control=control)
def refund(payment_id: str, amount: int) -> str:
    fd = os.open(runs, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, b"first\\n")
    os.close(fd)
    return "done"

with ctrlrun.context(agent="killed"):
    refund(payment_id="p1", amount=100)
"""


@pytest.mark.timeout(120)
def test_a_process_killed_at_any_statement_never_leaves_a_call_that_ran_retryable(
    tmp_path: Path,
) -> None:
    """Killed at each statement in turn: before the reservation commits nothing ran and the
    retry runs; from then on the record says executing (then ambiguous), or committed once
    that commit is written, never nothing or failed for a function that ran."""
    policy = tmp_path / "ctrlrun.yaml"
    policy.write_text(POLICY)
    outcomes: list[tuple[int, str, str]] = []
    for n in range(1, 40):
        run = tmp_path / str(n)
        run.mkdir()
        url, runs = f"sqlite:///{run / 'state.db'}", run / "runs"
        args = [sys.executable, "-c", KILLED_AT, str(policy), url, str(runs), str(n)]
        done = subprocess.run(args, capture_output=True, text=True, timeout=60, env=_clean_env())
        assert done.returncode in (0, -signal.SIGKILL), done.stderr
        store = open_store(url)
        left = state(store, "refund:p1")
        ran = runs.read_text().split() if runs.exists() else []
        retried = _retry(store, 60)  # a dead holder: judged on the ledger's clock
        store.close()
        outcomes.append((n, left, retried))
        if ran:
            assert left in ("executing", "committed"), (n, left)
            assert retried != "ran", n  # the effect ran twice
        else:
            assert left in ("none", "executing"), (n, left)
        if done.returncode == 0:
            break
    else:
        pytest.fail("the call never finished: more statements than expected")
    assert outcomes[0][1:] == ("none", "ran") and outcomes[-1][1:] == (
        "committed",
        "DuplicateEffect:committed",
    )


# -- work handed back to be done after the call is recorded ---------------------------------


@pytest.mark.parametrize("kind", ["future", "map", "filter"])
def test_a_function_that_returns_work_still_to_be_done_is_ambiguous_not_committed(
    tmp_path: Path, kind: str
) -> None:
    """``return pool.submit(api.refund, ...)`` or ``return map(api.refund, ids)``: the effect
    happens after the call returned (in a thread, or when the caller iterates), so the record
    said committed for a refund that had not happened yet, or never did (the future failed,
    the map was never iterated), and every retry was refused as a duplicate. Like an awaitable
    or a generator, it is refused: the call is ambiguous and pending work is cancelled."""
    store = SQLiteStateStore(tmp_path / "state.db")
    control = Control(Policy.from_yaml(POLICY), store)
    ran: list[str] = []
    gate = threading.Event()

    def send(payment_id: str) -> str:
        gate.wait(10)
        ran.append(payment_id)
        return payment_id

    with ThreadPoolExecutor(1) as pool:
        pool.submit(gate.wait, 10)  # the pool is busy: the refund queued behind it

        @protect("refund", control=control)
        def refund(payment_id: str) -> Any:
            if kind == "future":
                return pool.submit(send, payment_id)
            return (map if kind == "map" else filter)(send, [payment_id])

        with context("bot"), pytest.raises(InvalidArgument, match="after the call is recorded"):
            refund(payment_id="p1")
        gate.set()
    assert ran == []
    assert state(store, "refund:p1") == "ambiguous"
    store.close()
