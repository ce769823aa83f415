"""Other names for a guarded server, and framing around them, through a real sidecar to a
server that keeps every byte it is sent.

An address of the host's own interfaces (its LAN or pod address) reaches every server that
listens on all addresses, as most do, exactly as ``127.0.0.1`` does: a denied write to an
upstream at ``127.0.0.1`` sent to ``10.254.0.1`` reached it undecided. The test that shows it
runs in a network namespace of its own (``unshare -rn``), with that address on its loopback
interface, and is skipped where one cannot be made. The rest pin spellings and framings that
meet the guard or are refused before anything reaches the server.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from billing_support import recorder_sidecar
from rawproxy import exchange

pytestmark = pytest.mark.timeout(240)

# Formatted by the harness: braces are doubled.
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  billing.send:
    decision: deny
upstreams:
  billing:
    profile: http
    url: http://127.0.0.1:PORT
    routes:
      - {{method: POST, path: "/v1/invoices/{{invoice_id}}/send", action: billing.send}}
"""
SEND = "/v1/invoices/in_1/send"
OWN_V4, OWN_V6 = "10.254.0.1", "fd00:254::1"  # put on the namespace's loopback interface
MARK = "RESULTS "


def absolute(authority: str, *, method: str = "POST", path: str = SEND, host: str = "") -> bytes:
    lines = [f"{method} http://{authority}{path} HTTP/1.1", f"Host: {host or authority}"]
    return ("\r\n".join([*lines, "Content-Length: 0"]) + "\r\n\r\n").encode()


def tunnel(authority: str, inner: bytes) -> bytes:
    return f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode() + inner


def own_address_attacks(port: int) -> dict[str, bytes]:
    v4, v6 = f"{OWN_V4}:{port}", f"[{OWN_V6}]:{port}"
    origin = f"POST {SEND} HTTP/1.1\r\nHost: {v4}\r\nContent-Length: 0\r\n\r\n".encode()
    return {
        "v4": absolute(v4),
        "v6": absolute(v6),
        "v6-zone": absolute(f"[{OWN_V6}%25lo]:{port}", host=v6),
        "v4-mapped": absolute(f"[::ffff:{OWN_V4}]:{port}"),
        "v4-connect": tunnel(v4, origin),
        "v4-host-only": tunnel(f"127.0.0.1:{port}", origin),
    }


def _inside(workdir: Path) -> None:
    """In the namespace: the host's own addresses, a server on all of them, and the attacks."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "addr", "add", f"{OWN_V4}/32", "dev", "lo"], check=True)
    subprocess.run(["ip", "addr", "add", f"{OWN_V6}/128", "dev", "lo", "nodad"], check=True)
    results: dict[str, list[str]] = {}
    with recorder_sidecar(workdir, POLICY, bind="::") as (sc, upstream):
        for name, data in own_address_attacks(upstream.port).items():
            got = exchange(sc.proxy_url, data, answers=2 if name.endswith("connect") else 1)
            results[name] = [got.decode("latin-1")[:400], bytes(upstream.received).decode()]
        read = absolute(f"{OWN_V4}:{upstream.port}", method="GET", path="/v1/x")
        got = exchange(sc.proxy_url, read)
        results["read"] = [got.decode("latin-1")[:400], bytes(upstream.received).decode()]
    print(MARK + json.dumps(results), flush=True)


def _namespace_refused() -> str | None:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare (util-linux) and ip (iproute2) to make a network namespace"
    try:
        subprocess.run(
            ["unshare", "-rn", "ip", "link", "set", "lo", "up"],
            check=True,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot make a network namespace here (unshare -rn): {exc}"
    return None


def test_a_write_to_an_address_of_the_hosts_own_interfaces_is_guarded(tmp_path: Path) -> None:
    refused = _namespace_refused()
    if refused:
        pytest.skip(refused)
    done = subprocess.run(
        ["unshare", "-rn", sys.executable, __file__, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=200,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    results = json.loads(lines[-1][len(MARK) :])
    for name in own_address_attacks(0):
        answer, received = results[name]
        assert "X-Ctrlrun-Outcome: denied" in answer, (name, answer)
        assert "POST" not in received, (name, received)
    answer, received = results["read"]
    assert answer.startswith("HTTP/1.1 200") and received.startswith("GET /v1/x "), answer


if __name__ == "__main__":
    _inside(Path(sys.argv[1]))
