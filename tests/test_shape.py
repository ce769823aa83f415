"""House style that can be measured, over the whole product: no function over 60 lines, no
module over 400, in ``sdk/`` (the fakes in ``sdk/testing/`` included), ``proxy/`` and
``reconcilers/``. Aside: the demo script (``proxy/demo.py``) and the migrations, which are
written once and read as a script."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(
    p
    for top in ("sdk", "proxy", "reconcilers")
    for p in (ROOT / top).rglob("*.py")
    if "migrations" not in p.parts and p != ROOT / "proxy" / "demo.py"
)


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_room_is_measured() -> None:
    tops = {p.relative_to(ROOT).parts[0] for p in SOURCES}
    assert tops == {"sdk", "proxy", "reconcilers"}
    assert any(p.parts[-2] == "testing" for p in SOURCES)


@pytest.mark.parametrize("path", SOURCES, ids=_name)
def test_small_functions_in_small_modules(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    assert len(source.splitlines()) <= 400, f"{_name(path)}: over 400 lines, split it"
    long = [
        f"{node.name} (line {node.lineno}, {lines} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (lines := (node.end_lineno or node.lineno) - node.lineno + 1) > 60
    ]
    assert long == [], f"{_name(path)}: {', '.join(long)}"
