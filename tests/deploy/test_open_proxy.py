"""A sidecar listening on 0.0.0.0 is never an open proxy: public clients are cut off.

In a network namespace this test creates (only its loopback device, so nothing leaves it),
``ctrlrun proxy`` listens on 0.0.0.0 (explicit listener and a reverse one) and a tiny site
answers on 127.0.0.1. The namespace's loopback also carries a private address and a public
one. A client connecting from the public address is cut off before any request is read (the
site sees nothing); from loopback or the private address (a pod's agent) it is served.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

PROXY_PORT, REVERSE_PORT, SITE_PORT = 8080, 8081, 8090
PRIVATE = "10.77.0.7"
# A public address (by Python's table, which mitmproxy's block_global uses), held only by the
# namespace's own loopback device.
PUBLIC = next(a for a in ("192.88.99.7", "192.175.48.7") if ipaddress.ip_address(a).is_global)
POLICY = f"""\
schema: ctrlrun.policy/v2
actions: {{}}
upstreams:
  site:
    profile: http
    url: http://127.0.0.1:{SITE_PORT}
    listen: 0.0.0.0:{REVERSE_PORT}
    reconcile: "off"
"""


def _unavailable() -> str | None:
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "needs root to create a network namespace (CI runs as root)"
    for tool in ("ip", "curl"):
        if shutil.which(tool) is None:
            return f"needs {tool} (apt-get install iproute2 curl)"
    return None


pytestmark = pytest.mark.skipif(_unavailable() is not None, reason=str(_unavailable()))


def run(*argv: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {result.stderr.strip()}")
    return result


class Namespace:
    def __init__(self, name: str, workdir: Path) -> None:
        self.name, self.workdir = name, workdir

    def cmd(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def start(self, label: str, *argv: str) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{label}.log").open("wb")
        return subprocess.Popen(self.cmd(*argv), stdout=log, stderr=subprocess.STDOUT)

    def log(self, label: str) -> str:
        return (self.workdir / f"{label}.log").read_text(errors="replace")

    def wait_for(self, label: str, text: str, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if text in self.log(label):
                return
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"{label} did not start:\n{self.log(label)[-2000:]}")

    def curl(self, source: str, *args: str) -> tuple[int, str]:
        """One GET from ``source``: curl's exit code and the status it got."""
        argv = self.cmd("curl", "-sS", "--max-time", "10", "--interface", source, "--noproxy", "")
        out = run(*argv, "-o", "/dev/null", "-w", "%{http_code}", *args, timeout=60, check=False)
        return out.returncode, out.stdout.strip()


@pytest.fixture
def ns() -> Iterator[Namespace]:
    name = f"ctrlrun-open-{secrets.token_hex(3)}"
    workdir = Path(tempfile.mkdtemp(prefix="ctrlrun-open-proxy-"))
    (workdir / "site").mkdir()
    (workdir / "site" / "index.html").write_text("site\n")
    procs: list[subprocess.Popen[bytes]] = []
    space = Namespace(name, workdir)
    try:
        run("ip", "netns", "add", name)
        run(*space.cmd("ip", "link", "set", "lo", "up"))
        for address in (PRIVATE, PUBLIC):
            run(*space.cmd("ip", "addr", "add", f"{address}/32", "dev", "lo"))
        site = space.start(
            "site",
            sys.executable,
            "-u",
            "-m",
            "http.server",
            "--bind",
            "127.0.0.1",
            "--directory",
            str(workdir / "site"),
            str(SITE_PORT),
        )
        procs.append(site)
        space.wait_for("site", "Serving HTTP", site)
        (workdir / "ctrlrun.yaml").write_text(POLICY)
        proxy = space.start(
            "proxy",
            sys.executable,
            "-m",
            "ctrlrun.cli",
            "proxy",
            "--policy",
            str(workdir / "ctrlrun.yaml"),
            "--store-url",
            f"sqlite:///{workdir / 'state.db'}",
            "--listen",
            f"0.0.0.0:{PROXY_PORT}",
            "--confdir",
            str(workdir / "mitm"),
            "--principal",
            "agent",
        )
        procs.append(proxy)
        space.wait_for("proxy", "ctrlrun proxy listening", proxy)
        yield space
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        run("ip", "netns", "del", name, check=False)
        shutil.rmtree(workdir, ignore_errors=True)


def site_requests(ns: Namespace) -> int:
    return ns.log("site").count('"GET /')


def test_a_sidecar_on_every_address_serves_only_local_and_private_clients(ns: Namespace) -> None:
    site = f"http://127.0.0.1:{SITE_PORT}/"
    served = 0
    for source in ("127.0.0.1", PRIVATE):
        # Explicit proxy, and the reverse listener, each reached at the source's own address.
        assert ns.curl(source, "-x", f"http://{source}:{PROXY_PORT}", site) == (0, "200")
        assert ns.curl(source, f"http://{source}:{REVERSE_PORT}/") == (0, "200")
        served += 2
    assert site_requests(ns) == served
    for args in (
        ("-x", f"http://{PUBLIC}:{PROXY_PORT}", site),
        (f"http://{PUBLIC}:{REVERSE_PORT}/",),
    ):
        code, status = ns.curl(PUBLIC, *args)
        assert code != 0 and status == "000", f"a public client was served: {code} {status}"
    assert site_requests(ns) == served  # nothing reached the site
    assert ns.log("proxy").count("killed by block_global") == 2
