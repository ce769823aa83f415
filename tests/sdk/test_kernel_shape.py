"""House style that can be measured: no function in the kernel over 60 lines, no module over 400."""

from __future__ import annotations

import ast
from pathlib import Path

SDK = Path(__file__).resolve().parents[2] / "sdk"
SOURCES = sorted(p for p in SDK.rglob("*.py") if "migrations" not in p.parts)


def test_no_function_over_60_lines() -> None:
    long = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > 60:
                    long.append(f"{path.relative_to(SDK.parent)}:{node.lineno} {node.name} {lines}")
    assert long == []


def test_no_module_over_400_lines() -> None:
    big = [
        f"{path.relative_to(SDK.parent)} {n}"
        for path in SOURCES
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > 400
    ]
    assert SOURCES and big == []
