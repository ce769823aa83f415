"""Lint, format and types stay clean: ruff over the repository, mypy --strict over ctrlrun."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["sdk", "proxy", "reconcilers", "examples", "tests"]


def ruff(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    return subprocess.run(
        [exe, *args, *SOURCES], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_ruff_check() -> None:
    result = ruff("check", "--no-cache")
    assert result.returncode == 0, result.stdout[-4000:]


def test_ruff_format() -> None:
    result = ruff("format", "--check", "--no-cache")
    assert result.returncode == 0, result.stdout[-4000:]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_mypy_strict() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "typecheck.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=590,
    )
    assert result.returncode == 0, result.stdout[-4000:]
