"""The proxy stays in small pieces: no function over 60 lines, no module over 400.

(``demo.py`` is the demo script, and ``fakes/`` are test servers: both aside.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROXY = Path(__file__).resolve().parents[2] / "proxy"
MODULES = sorted(p for p in PROXY.glob("*.py") if p.name != "demo.py")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_small_functions_in_small_modules(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    assert len(source.splitlines()) <= 400, f"{path.name}: split it"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > 60
    ]
    assert long == [], f"{path.name}: {', '.join(long)}"
