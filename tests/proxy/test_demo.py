"""``ctrlrun demo`` runs offline and says what happened, with the remotes' own counts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_demo_exits_zero_and_names_each_outcome(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "ctrlrun.cli", "demo", "--dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "Traceback" not in result.stderr
    for expected in [
        "upstream_ambiguous: reconciler: committed",
        "duplicate (HTTP 409)",
        "Stripe holds 1 refund(s)",
        "reconciler: unknown (the write may still land",
        "agent retries -> ambiguous (HTTP 403)",
        "resolved failed by operator",
        "the cluster runs checkout at 6",
        "denied (HTTP 403); the cluster saw 0 delete(s)",
        "approval_required",
        "approval_invalid: mismatch",
        "re-sends the approved request -> HTTP 200",
        "5. An agent's refund through Stripe's MCP server",
        "connection dropped -> upstream_ambiguous: reconciler: committed",
        "agent calls it again -> duplicate",
        "Read the receipts: ctrlrun receipts --store-url sqlite:///",
    ]:
        assert expected in out, expected
    receipts = subprocess.run(
        [
            sys.executable,
            "-m",
            "ctrlrun.cli",
            "receipts",
            "--verify-chain",
            "--store-url",
            f"sqlite:///{tmp_path / 'demo' / 'state.db'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert receipts.returncode == 0 and "chain intact" in receipts.stdout
