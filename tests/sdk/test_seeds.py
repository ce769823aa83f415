"""The documentation pages in ../shared/seeds run verbatim and print exactly what they say.

The pages are read at test time; their text and code are not copied into this repository.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SEEDS = (Path(__file__).resolve().parents[2] / "../shared/seeds").resolve()
PAGES = sorted(SEEDS.glob("*.txt")) if SEEDS.is_dir() else []
# A fenced block, possibly indented (inside <Step>): opening fence, info string, body, the
# closing fence at the same indent.
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>\w+)(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)```",
    re.MULTILINE | re.DOTALL,
)

pytestmark = pytest.mark.skipif(not PAGES, reason=f"no seed pages at {SEEDS}")


def blocks(page: str, lang: str, *, runnable: bool) -> list[str]:
    found = []
    for m in FENCE.finditer(page):
        if m["lang"] == lang and ("runnable" in m["info"].split()) == runnable:
            found.append(textwrap.dedent(m["body"]))
    return found


def ctrlrun_command() -> list[str]:
    script = Path(sys.executable).with_name("ctrlrun")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ctrlrun.cli"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("index", range(len(PAGES)), ids=[p.stem for p in PAGES])
def test_seed_page_runs_verbatim(index: int, tmp_path: Path) -> None:
    page = PAGES[index].read_text(encoding="utf-8")
    (policy,) = blocks(page, "yaml", runnable=True)
    (program,) = blocks(page, "python", runnable=True)
    (expected,) = blocks(page, "text", runnable=False)
    (tmp_path / "ctrlrun.yaml").write_text(policy, encoding="utf-8")
    (tmp_path / "main.py").write_text(program, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTRLRUN_")}

    ran = subprocess.run(
        [sys.executable, "main.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == expected
    assert "Traceback" not in ran.stderr

    shown = subprocess.run(
        [*ctrlrun_command(), "receipts"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    started = [line for line in lines if "  RECONCILIATION_STARTED  " in line]
    answers = [line.rsplit("  ", 1)[-1] for line in lines if "  RECONCILIATION_RESOLVED  " in line]
    assert started and len(started) == len(answers)
    assert "committed" in answers
    if index == 1:  # the second page also has a hook that finds the effect never happened
        assert "not_executed" in answers
