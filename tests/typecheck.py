"""Run ``mypy --strict`` on the three packages under their import names.

The distribution maps ``sdk/`` to ``ctrlrun`` (and ``proxy/``, ``reconcilers/`` inside it),
which an editable install resolves with an import hook mypy cannot follow; so this lays a
tree of symlinks that mirrors the installed layout and checks that.
Usage: python tests/typecheck.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPING = {"sdk": "ctrlrun", "proxy": "ctrlrun/proxy", "reconcilers": "ctrlrun/reconcilers"}


def mirror(into: Path) -> Path:
    for source, target in MAPPING.items():
        for path in (ROOT / source).rglob("*.py"):
            rel = path.relative_to(ROOT / source)
            dest = into / target / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.exists():
                os.symlink(path, dest)
    (into / "ctrlrun" / "py.typed").touch()
    return into


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tree = mirror(Path(tmp))
        cmd = [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--exclude",
            "migrations/",
            "-p",
            "ctrlrun",
        ]
        env = {**os.environ, "MYPYPATH": str(tree)}
        return subprocess.call(cmd, cwd=tree, env=env)


if __name__ == "__main__":
    sys.exit(main())
