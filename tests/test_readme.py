"""The README keeps its promises: every CLI command is documented, and its commands run."""

from __future__ import annotations

import re
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


def ci_commands(script: str) -> list[str]:
    """The command lines of a shell script: no comments, no blank lines."""
    lines = [line.strip() for line in script.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_the_two_commands_come_first() -> None:
    first, second = bash_blocks()[:2]
    assert "ctrlrun demo" in first
    assert "pytest" in second
    ci = ci_commands((ROOT / ".ci" / "run").read_text())
    assert ci[-1] == second.strip(), ".ci/run must end with exactly the README's test command"


def test_ci_runs_the_checks_that_are_not_tests() -> None:
    """Lint, types and the fresh clone left the suite for .ci/run: they must stay there."""
    ci = ci_commands((ROOT / ".ci" / "run").read_text())
    for check in (
        ".venv/bin/ruff check --no-cache",
        ".venv/bin/ruff format --check --no-cache",
        ".venv/bin/python tests/typecheck.py",
        "bash .ci/fresh-clone",
        "bash .ci/wheel-demo",
    ):
        assert any(line.startswith(check) for line in ci[:-1]), check
    fresh = (ROOT / ".ci" / "fresh-clone").read_text()
    assert "Read the receipts: ctrlrun receipts" in fresh  # what the demo prints at its end
    for script in ("run", "fresh-clone", "wheel-demo"):
        path = ROOT / ".ci" / script
        syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert syntax.returncode == 0, syntax.stderr


def test_reconciler_example_runs() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "reconcile_with_fakes.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "refunds at Stripe: 1" in result.stdout
