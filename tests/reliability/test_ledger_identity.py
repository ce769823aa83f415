"""A ledger knows itself: its file deleted, replaced, truncated or its WAL removed under a
running sidecar is noticed, refused until an operator acts, and never recreated empty.

The figure for each fault: what the agent's re-sent refunds got, how many refunds the remote
ran, whether the next start was refused, and what the restored ledger answers.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from e2e.harness import STRIPE_KEY, Sidecar, clean_env

from ctrlrun.identity import marker_path
from ctrlrun.store import SQLiteStateStore
from ctrlrun.testing import FakeKubernetes, FakeStripe

AUTH = {"Authorization": f"Bearer {STRIPE_KEY}"}


def refund(client: httpx.Client, pi: str) -> str:
    r = client.post("/v1/refunds", data={"payment_intent": pi, "amount": "100"}, headers=AUTH)
    return r.headers.get("x-ctrlrun-outcome", str(r.status_code))


def delete(db: Path) -> None:
    db.unlink()


def replace(db: Path) -> None:
    other = db.with_name("other.db")
    SQLiteStateStore(other).close()  # a valid ledger, but another one
    os.replace(other, db)


def truncate(db: Path) -> None:
    os.truncate(db, 0)


def remove_wal(db: Path) -> None:
    Path(f"{db}-wal").unlink()


FAULTS: dict[str, Callable[[Path], None]] = {
    "deleted": delete,
    "replaced": replace,
    "truncated": truncate,
    "wal_removed": remove_wal,
}


def ctrlrun(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ctrlrun.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=workdir,
        env=clean_env(),
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_lost_ledger_is_refused_until_an_operator_acts(
    fault: str,
    fakes: tuple[FakeStripe, FakeKubernetes],
    sidecars: Callable[..., Sidecar],
    tmp_path: Path,
) -> None:
    stripe, kube = fakes
    pis = [stripe.add_payment_intent(amount=5000)["id"] for _ in range(5)]
    sc = sidecars(stripe, kube, workdir=tmp_path / "sc", reconcile="off")
    db = Path(sc.store_url.removeprefix("sqlite:///"))
    with httpx.Client(base_url=sc.stripe_base, timeout=30, trust_env=False) as client:
        first = [refund(client, pi) for pi in pis[:3]]
        FAULTS[fault](db)
        during = [refund(client, pi) for pi in pis]  # the agent re-sends, and sends new ones
    ran = stripe.count("POST", "/v1/refunds")
    alive = sc.proc is not None and sc.proc.poll() is None
    sc.stop(signal.SIGTERM)
    log = sc.log.read_text()
    check = ctrlrun(
        sc.workdir, "proxy", "--policy", str(sc.policy), "--store-url", sc.store_url, "--check"
    )
    rescued = sorted(db.parent.glob(f"{db.name}.rescued-*"))
    if rescued:  # the operator puts the saved copy in place and tells ctrlrun
        for stale in (Path(f"{db}-wal"), Path(f"{db}-shm")):
            stale.unlink(missing_ok=True)
        shutil.move(rescued[0], db)
        accepted = ctrlrun(sc.workdir, "doctor", "--store-url", sc.store_url, "--accept")
        assert accepted.returncode == 0, accepted.stdout + accepted.stderr
        again = sidecars(stripe, kube, workdir=sc.workdir, reconcile="off")
        with httpx.Client(base_url=again.stripe_base, timeout=30, trust_env=False) as client:
            after = [refund(client, pi) for pi in pis[:3]]
    else:
        after = []
    print(
        f"{fault}: first={first} during={during} refunds_run={ran} proxy_alive={alive} "
        f"restart_exit={check.returncode} rescued={bool(rescued)} after_restore={after} "
        f"refused_line={check.stderr.strip()[:160]!r}"
    )
    assert first == ["200"] * 3
    assert during == ["unavailable"] * 5
    assert ran == 3  # nothing ran twice, nothing new was sent into a ledger that forgot
    assert alive
    assert sum("while in use" in line for line in log.splitlines()) == 1, log[-2000:]
    assert "Traceback" not in log
    assert check.returncode == 2 and len(check.stderr.strip().splitlines()) == 1, check.stderr
    assert "ledger" in check.stderr
    assert marker_path(db).exists()
    # A truncated file is saved only while what it held is still in the WAL; a copy that is
    # not whole is never left to be trusted. Only a backup brings the rest back.
    assert rescued or fault == "truncated"
    if rescued:
        assert after == ["duplicate"] * 3  # every acknowledged record is back
        assert stripe.count("POST", "/v1/refunds") == 3
