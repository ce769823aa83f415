"""The rooms of ctrlrun and the way imports flow between them.

``ctrlrun.proxy`` -> ``ctrlrun.reconcilers`` -> ``ctrlrun`` (the kernel), never back, and no
cycle anywhere inside ``ctrlrun``: every ``import`` statement counts, at the top of a module or
inside a function, because a lazy import is still a dependency (it only fails later). The
graph is read from the sources with ``ast``, so a module that is never imported in a test run
is checked too. ``ctrlrun.cli`` and ``ctrlrun.testing`` sit outside the kernel: they may reach
into the proxy (lazily, so the kernel's commands work without the proxy extra).

An import under ``if TYPE_CHECKING:`` never runs, so it makes no cycle; it still counts for the
direction (the kernel does not even name the proxy's types).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Where each package's sources live (pyproject.toml's package-dir).
PACKAGES = {"ctrlrun": ROOT / "sdk", "ctrlrun.proxy": ROOT / "proxy"}
PACKAGES["ctrlrun.reconcilers"] = ROOT / "reconcilers"
OUTSIDE_THE_KERNEL = ("ctrlrun.proxy", "ctrlrun.reconcilers", "ctrlrun.testing", "ctrlrun.cli")
HEAVY = ("mitmproxy", "httpx", "psycopg", "opentelemetry")

Edge = tuple[str, str, int, bool]  # importer, imported, line, only under TYPE_CHECKING


def modules() -> dict[str, Path]:
    """Every module of the distribution by its import name (migrations aside)."""
    found: dict[str, Path] = {}
    for package, root in PACKAGES.items():
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            if "migrations" in rel.parts:
                continue  # Alembic loads them by path
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            found[".".join((package, *parts))] = path
    return found


MODULES = modules()


def is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def within(name: str, room: str) -> bool:
    return name == room or name.startswith(room + ".")


def _target(importer: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names."""
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package(importer) else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _typing_only(tree: ast.AST) -> set[int]:
    """The ids of the import statements under ``if TYPE_CHECKING:``."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return found


def imports(importer: str, tree: ast.AST) -> Iterator[tuple[str, int, bool]]:
    """Each module that ``importer`` imports, wherever the statement is, and whether the
    statement is for type checking only."""
    typing_only = _typing_only(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, id(node) in typing_only
        elif isinstance(node, ast.ImportFrom):
            target = _target(importer, node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                # ``from pkg import mod`` depends on pkg.mod; ``from mod import name`` on mod.
                yield (sub if sub in MODULES else target), node.lineno, id(node) in typing_only


def graph() -> list[Edge]:
    edges: set[Edge] = set()
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for imported, line, typing_only in imports(name, tree):
            if within(imported, "ctrlrun"):
                assert imported in MODULES, f"{path}:{line}: {imported} is not a module"
                edges.add((name, imported, line, typing_only))
    return sorted(edges)


EDGES = graph()


def cycles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components with more than one module, or a self-import."""
    after: dict[str, set[str]] = {name: set() for name in MODULES}
    for importer, imported, _, typing_only in edges:
        if not typing_only:
            after[importer].add(imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan; the graph is small, recursion is fine
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(after[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            component.append(node)
            if len(component) > 1 or node in after[node]:
                found.append(sorted(component))

    for name in sorted(MODULES):
        if name not in index:
            visit(name)
    return found


def show(edges: list[Edge]) -> str:
    return "\n".join(f"{MODULES[e[0]].relative_to(ROOT)}:{e[2]}: imports {e[1]}" for e in edges)


def test_the_walk_sees_every_room_and_lazy_imports() -> None:
    assert {"ctrlrun", "ctrlrun.policy", "ctrlrun.proxy", "ctrlrun.reconcilers"} <= set(MODULES)
    assert len(EDGES) > 100
    source = (
        "def f():\n    from .config import Upstream\n    import ctrlrun.ledger\n"
        "if TYPE_CHECKING:\n    from .. import policy\n"
    )
    lazy = set(imports("ctrlrun.proxy.routes", ast.parse(source)))
    assert lazy == {
        ("ctrlrun.proxy.config", 2, False),
        ("ctrlrun.ledger", 3, False),
        ("ctrlrun.policy", 5, True),
    }


def test_the_cycle_finder_finds_a_cycle() -> None:
    a, b = sorted(MODULES)[:2]
    assert cycles([(a, b, 1, False), (b, a, 1, False)]) == [sorted([a, b])]
    assert cycles([(a, a, 1, False)]) == [[a]]
    assert cycles([(a, b, 1, False)]) == []
    assert cycles([(a, b, 1, False), (b, a, 1, True)]) == []


def test_no_import_cycle_inside_ctrlrun() -> None:
    found = cycles(EDGES)
    detail = [show([e for e in EDGES if e[0] in c and e[1] in c and not e[3]]) for c in found]
    assert not found, "import cycles:\n" + "\n\n".join(detail)


@pytest.mark.parametrize(
    ("room", "forbidden"),
    [
        ("ctrlrun", ("ctrlrun.proxy", "ctrlrun.reconcilers", "ctrlrun.testing", "ctrlrun.cli")),
        ("ctrlrun.reconcilers", ("ctrlrun.proxy", "ctrlrun.testing", "ctrlrun.cli")),
        ("ctrlrun.proxy", ("ctrlrun.cli",)),
    ],
)
def test_imports_flow_one_way(room: str, forbidden: tuple[str, ...]) -> None:
    """proxy -> reconcilers -> kernel; the kernel is ctrlrun.* outside the other rooms."""

    def in_room(name: str) -> bool:
        if room != "ctrlrun":
            return within(name, room)
        return not any(within(name, other) for other in OUTSIDE_THE_KERNEL)

    wrong = [e for e in EDGES if in_room(e[0]) and any(within(e[1], f) for f in forbidden)]
    assert not wrong, "imports against the flow:\n" + show(wrong)


def loaded_after(code: str) -> list[str]:
    """The modules (of HEAVY and of ctrlrun) a fresh interpreter holds after ``code``."""
    probe = (
        f"import json, sys\n{code}\n"
        f"roots = {HEAVY!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules\n"
        "    if m.split('.')[0] in roots or m.startswith('ctrlrun'))))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert ran.returncode == 0, ran.stderr
    return list(json.loads(ran.stdout))


def test_import_ctrlrun_stays_light() -> None:
    loaded = loaded_after("import ctrlrun")
    assert [m for m in loaded if m.split(".")[0] in HEAVY] == []
    assert [m for m in loaded if any(within(m, r) for r in OUTSIDE_THE_KERNEL)] == []


def test_an_sdk_process_reads_a_proxy_policy_without_the_proxy() -> None:
    code = (
        "import ctrlrun\n"
        "p = ctrlrun.Policy.from_yaml('schema: ctrlrun.policy/v2\\n"
        "actions: {a: {decision: allow}}\\n"
        "upstreams: {s: {profile: stripe, url: https://api.stripe.com}}\\n"
        "agents: {bot: {token_env: BOT_TOKEN}}\\n')\n"
        "assert p.evaluate('a', {}).decision == 'allow'\n"
    )
    loaded = loaded_after(code)
    assert [m for m in loaded if m.split(".")[0] in HEAVY] == []
    assert [m for m in loaded if within(m, "ctrlrun.proxy")] == []


def test_the_cli_and_the_proxy_package_import_light() -> None:
    cli = loaded_after("import ctrlrun.cli")
    assert [m for m in cli if m.split(".")[0] in HEAVY] == []
    assert [m for m in cli if within(m, "ctrlrun.proxy") or within(m, "ctrlrun.reconcilers")] == []
    proxy = loaded_after("import ctrlrun.proxy, ctrlrun.proxy.config_parse")
    assert [m for m in proxy if m.split(".")[0] in HEAVY] == []
    assert [m for m in proxy if within(m, "ctrlrun.testing") or ".fakes" in m] == []


def test_test_modules_outside_packages_have_unique_names() -> None:
    """pytest imports a test module outside a package by its basename: two of one name in
    different folders stop the whole suite at collection."""
    tests = Path(__file__).resolve().parent
    loose = [p for p in tests.rglob("test_*.py") if not (p.parent / "__init__.py").exists()]
    names = [p.name for p in loose]
    assert sorted({n for n in names if names.count(n) > 1}) == []
