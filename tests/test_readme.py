"""The README keeps its promises: every CLI command is documented, and its commands run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from ctrlrun.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def commands(group: click.Group, prefix: str = "") -> list[str]:
    names = []
    for name, cmd in sorted(group.commands.items()):
        names.append(f"{prefix}{name}")
        if isinstance(cmd, click.Group):
            names += commands(cmd, f"{prefix}{name} ")
    return names


@pytest.mark.parametrize("command", commands(main))
def test_every_cli_command_is_in_the_readme(command: str) -> None:
    assert f"ctrlrun {command}" in README


def bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README, re.S)


def test_the_two_commands_come_first() -> None:
    first, second = bash_blocks()[:2]
    assert "ctrlrun demo" in first
    assert "pytest" in second
    ci = (ROOT / ".ci" / "run").read_text()
    assert second.strip() in ci, ".ci/run must run exactly the README's test command"


def test_reconciler_example_runs() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "reconcile_with_fakes.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "refunds at Stripe: 1" in result.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(shutil.which("git") is None, reason="git is needed to clone")
def test_readme_install_and_demo_work_on_a_fresh_clone(tmp_path: Path) -> None:
    """The README's first command, verbatim, in a fresh clone with a fresh virtualenv."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH") and not k.lower().endswith("_proxy")
    }
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if "venv" not in p
    )
    result = subprocess.run(
        ["bash", "-c", bash_blocks()[0].strip()],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=850,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Read the receipts: ctrlrun receipts" in result.stdout
