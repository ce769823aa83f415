"""A process killed inside its executor: the next attempt finds the effect ambiguous."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sdk_support import events, receipts, run_cli

from ctrlrun import (
    AmbiguousEffect,
    Control,
    EffectState,
    Policy,
    SQLiteStateStore,
    context,
    idempotency_token,
    protect,
)
from ctrlrun import ledger as L

WORKER = Path(__file__).with_name("crash_worker.py")


def crash(policy_file: Path, url: str, tmp_path: Path) -> str:
    """Run the worker until it is inside its executor, then SIGKILL it; return its token."""
    marker = tmp_path / "inside-executor"
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(policy_file), url, str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while not marker.exists() or not marker.read_text():
            assert proc.poll() is None, proc.communicate()[1].decode()
            assert time.monotonic() < deadline, "the worker never reached its executor"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    return marker.read_text()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("settle", ["cli_resolve_failed", "reconcile_not_executed"])
def test_sigkill_inside_executor_is_ambiguous_until_settled(
    policy_file: Path,
    store: SQLiteStateStore,
    db_path: Path,
    tmp_path: Path,
    settle: str,
) -> None:
    # A real clock here: the lease that runs out is the dead process's, written in real time.
    control = Control(Policy.from_file(policy_file), store)
    url = f"sqlite:///{db_path}"
    dead_token = crash(policy_file, url, tmp_path)

    with store.reading() as conn:
        rec = L.get_effect(conn, "refund:p1")
    assert rec is not None and rec.state is EffectState.EXECUTING and rec.attempt == 1
    time.sleep(1.2)  # wait the 1 s lease out
    listed = run_cli(["effects", "--store-url", url], tmp_path)
    assert "refund:p1  executing (lease expired)  attempt 1" in listed.out

    runs: list[str] = []
    answers: list[str] = []
    verdict = ["unknown"]  # what the remote can tell: nothing yet

    def hook(key: str) -> str:
        answers.append(key)
        return verdict[0]

    @protect("refund", reconcile=hook, control=control)
    def refund(payment_id: str, amount: int) -> None:
        runs.append(idempotency_token())

    with context("bot"):
        for _ in range(2):  # refused, and refused again: nothing moves it on its own
            with pytest.raises(AmbiguousEffect) as info:
                refund(payment_id="p1", amount=100)
            assert info.value.effect_key == "refund:p1"
        assert runs == []
        with store.reading() as conn:
            rec = L.get_effect(conn, "refund:p1")
        assert rec is not None and rec.state is EffectState.AMBIGUOUS

        assert answers == ["refund:p1"] * 2  # lazy: one question per attempt
        if settle == "reconcile_not_executed":
            verdict[0] = "not_executed"
        else:
            ran = run_cli(
                ["resolve", "refund:p1", "--failed", "--as", "bob", "--store-url", url], tmp_path
            )
            assert ran.code == 0, ran.err
            assert "refund:p1 resolved failed by bob" in ran.out
        refund(payment_id="p1", amount=100)

    assert len(runs) == 1 and runs[0] != dead_token
    with store.reading() as conn:
        rec = L.get_effect(conn, "refund:p1")
    assert rec is not None and rec.state is EffectState.COMMITTED and rec.attempt == 2
    assert [r["result"] for r in receipts(store)] == ["blocked", "blocked", "committed"]
    types = [t for t, _ in events(store, "refund:p1")]
    assert types.count("EXECUTION_AMBIGUOUS") == 1  # written once, by the first contender
    assert "EFFECT_RESOLVED" in types
