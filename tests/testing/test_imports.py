"""The fakes are their own package: production imports never pull them (or their server) in."""

from __future__ import annotations

import json
import subprocess
import sys

LOADED = "import json, sys\nprint(json.dumps(sorted(sys.modules)))\n"


def modules_after(code: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-c", code + "\n" + LOADED],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


def top(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def test_the_kernel_imports_neither_the_fakes_nor_their_http_stack() -> None:
    loaded = modules_after("import ctrlrun")
    assert top(loaded).isdisjoint({"mitmproxy", "httpx", "psycopg", "h11"})
    assert not any(m.startswith("ctrlrun.testing") for m in loaded)


def test_the_production_proxy_does_not_import_the_fakes() -> None:
    # Every module of ctrlrun.proxy but the demo, which is the one that runs the fakes.
    code = (
        "import importlib, pkgutil, ctrlrun.proxy as p\n"
        "for m in pkgutil.walk_packages(p.__path__, 'ctrlrun.proxy.'):\n"
        "    if m.name != 'ctrlrun.proxy.demo':\n"
        "        importlib.import_module(m.name)\n"
    )
    loaded = modules_after(code)
    assert "ctrlrun.proxy.addon" in loaded  # the walk did import the proxy
    assert not any(m.startswith("ctrlrun.testing") for m in loaded)
    assert "mcp" not in top(loaded)  # MCP upstreams are guarded without the mcp SDK


def test_importing_the_proxy_package_leaves_the_fakes_out() -> None:
    loaded = modules_after("import ctrlrun.proxy")
    assert not any(m.startswith("ctrlrun.testing") for m in loaded)


def test_plain_http_fakes_need_no_proxy_extra() -> None:
    # The CA (mitmproxy's cert store) is only imported for tls=True.
    loaded = modules_after(
        "from ctrlrun.testing import FakeStripe\nwith FakeStripe() as f:\n    assert f.url\n"
    )
    assert "h11" in loaded and "mitmproxy" not in top(loaded)


def test_tls_without_the_proxy_extra_names_the_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['mitmproxy'] = None  # as if the proxy extra were not installed\n"
        "from ctrlrun.errors import MissingDependency\n"
        "from ctrlrun.testing import FakeStripe\n"
        "try:\n"
        "    FakeStripe(tls=True)\n"
        "except MissingDependency as exc:\n"
        "    assert \"pip install 'ctrlrun[proxy]'\" in str(exc), exc\n"
        "else:\n"
        "    raise SystemExit('no MissingDependency')\n"
    )
    modules_after(code)
