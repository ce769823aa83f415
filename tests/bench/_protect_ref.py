"""The reference ``ctrlrun==0.12.2``: a venv made once under the cache directory, and reused.

``bench_protect.py`` runs the reference's worker under this venv's interpreter (the two
distributions both import as ``ctrlrun``); for PostgreSQL, ``bench_ledger.py`` and
``bench_protect.py --postgres`` add psycopg to it (``_ledger_pg.reference_psycopg``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REFERENCE = "ctrlrun==0.12.2"
REFERENCE_VERSION = REFERENCE.split("==")[1]


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ctrlrun-bench"


def reference_python(cache: Path, timeout: float) -> tuple[str | None, str]:
    """The reference venv's interpreter (created on first use), or None and the reason."""
    venv = cache / "ref-venv"
    python = venv / "bin" / "python"
    if _installed_version(python) == REFERENCE_VERSION:
        return str(python), f"reusing {venv}"
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    steps = (
        ("python -m venv", [sys.executable, "-m", "venv", str(venv)]),
        (
            f"pip install {REFERENCE}",
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", REFERENCE],
        ),
    )
    for what, step in steps:
        left = timeout - (time.monotonic() - started)
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=max(left, 1.0))
        except subprocess.TimeoutExpired:
            shutil.rmtree(venv, ignore_errors=True)
            return None, f"`{what}` took longer than {timeout:.0f} s"
        except OSError as exc:
            return None, f"cannot run {step[0]}: {exc}"
        if done.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            lines = [
                ln
                for ln in (done.stderr or done.stdout).splitlines()
                if ln.strip() and not ln.startswith("WARNING: Location")
            ]
            return None, f"`{what}` failed: {' | '.join(lines[-3:])}"
    if _installed_version(python) != REFERENCE_VERSION:
        return None, f"{REFERENCE} did not install into {venv}"
    return str(python), f"created {venv} in {time.monotonic() - started:.1f} s"


def _installed_version(python: Path) -> str | None:
    if not python.exists():
        return None
    probe = "import importlib.metadata as m; print(m.version('ctrlrun'))"
    try:
        done = subprocess.run(
            [str(python), "-I", "-c", probe], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def reference(args: argparse.Namespace, out: dict[str, Any], say: Any) -> str | None:
    """The reference venv's interpreter, or None (and why, said)."""
    ref_python, note = (None, "skipped (--no-reference)")
    if not args.no_reference:
        ref_python, note = reference_python(args.cache_dir, timeout=180)
    out["reference_venv"] = note
    if ref_python is None:
        say(f"reference {REFERENCE}: NOT MEASURED — {note}")
    else:
        say(f"reference venv: {note}")
    return ref_python
