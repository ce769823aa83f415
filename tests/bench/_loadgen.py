"""The rig of ``bench_proxy.py``: a load generator, a tiny upstream, child processes, py-spy.

Standard library only. The client speaks raw HTTP/1.1 over asyncio protocols (no parser
library, no per-request objects beyond the bytes it sends): one request in flight per
connection, responses framed by ``Content-Length``. The upstream answers ``200`` with one
fixed JSON body to every request. Neither end does more than it must, so what a run measures
is the proxy between them. The children (upstream, proxies) run in sessions of their own and
die with the bench; their CPU time is read from ``/proc``; ``py_spy`` samples one of them.

    python -I tests/bench/_loadgen.py upstream [--port 0]   # prints "listening PORT"
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_HEAD = 64 * 1024
# About the size of a Stripe refund object, so a proxy copies a realistic answer.
BODY = (
    b'{"id": "re_bench", "object": "refund", "amount": 100, "balance_transaction": null, '
    b'"charge": "ch_bench", "created": 1700000000, "currency": "usd", "metadata": {}, '
    b'"payment_intent": "pi_bench", "reason": null, "receipt_number": null, '
    b'"source_transfer_reversal": null, "status": "succeeded", "transfer_reversal": null}'
)
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nRequest-Id: req_bench\r\n"
    b"Content-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY
)


class LoadError(RuntimeError):
    """A connection failed, or answered something the client cannot frame."""


def _content_length(head: bytes) -> int:
    """The Content-Length of a message head, or -1 when it has none."""
    lower = head.lower()
    at = lower.find(b"\r\ncontent-length:")
    if at < 0:
        return -1
    end = lower.find(b"\r\n", at + 2)
    return int(lower[at + 17 : end if end >= 0 else None])


# -- the client ----------------------------------------------------------------------------


class _Conn(asyncio.Protocol):
    """One keep-alive connection; ``send`` writes a request, its future gets the status."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[int] | None = None
        self.lost: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, request: bytes) -> asyncio.Future[int]:
        if self.lost is not None or self.transport is None:
            raise LoadError(f"connection lost: {self.lost}")
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > MAX_HEAD:
                self._fail(LoadError("response head too large"))
            return
        head = bytes(self.buf[:end])
        length = _content_length(head)
        if length < 0:
            self._fail(LoadError(f"response without Content-Length: {head[:200]!r}"))
            return
        if len(self.buf) < end + 4 + length:
            return
        del self.buf[: end + 4 + length]
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(int(head[9:12]))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(LoadError(f"connection closed by the server ({exc or 'EOF'})"))

    def _fail(self, exc: BaseException) -> None:
        self.lost = exc
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


@dataclass
class Result:
    """What one load run did: answers, elapsed wall time, latencies (ns), statuses, errors."""

    requests: int = 0
    seconds: float = 0.0
    latencies_ns: list[int] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        """The ``q`` quantile (0..1) of the latencies in milliseconds (nearest rank)."""
        if not self.latencies_ns:
            return float("nan")
        data = sorted(self.latencies_ns)
        return data[min(len(data) - 1, max(0, round(q * len(data) + 0.5) - 1))] / 1e6


async def run_load(
    host: str,
    port: int,
    make_request: Callable[[], bytes],
    *,
    connections: int,
    requests: int,
    seconds: float,
    keep_latencies: bool = False,
) -> Result:
    """Drive ``connections`` keep-alive connections until ``requests`` are answered or
    ``seconds`` have passed, whichever comes first."""
    loop = asyncio.get_running_loop()
    conns: list[_Conn] = []
    try:
        for _ in range(connections):
            _, proto = await asyncio.wait_for(loop.create_connection(_Conn, host, port), 10)
            conns.append(proto)
        out = Result()
        left = [requests]
        perf = time.perf_counter_ns
        start = perf()
        deadline = start + int(seconds * 1e9)

        async def drive(conn: _Conn) -> None:
            lat, statuses = out.latencies_ns, out.statuses
            while left[0] > 0:
                left[0] -= 1
                t0 = perf()
                if t0 >= deadline:
                    return
                status = await conn.send(make_request())
                t1 = perf()
                out.requests += 1
                statuses[status] = statuses.get(status, 0) + 1
                if keep_latencies:
                    lat.append(t1 - t0)

        done = await asyncio.gather(*(drive(c) for c in conns), return_exceptions=True)
        out.seconds = (perf() - start) / 1e9
        out.errors = [f"{type(e).__name__}: {e}" for e in done if isinstance(e, BaseException)]
        return out
    finally:
        for c in conns:
            if c.transport is not None:
                c.transport.close()


# -- the upstream ----------------------------------------------------------------------------


class _Upstream(asyncio.Protocol):
    """Answers every complete request on the connection with ``RESPONSE`` (pipelined too)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        answers = 0
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            length = max(_content_length(bytes(self.buf[:end])), 0)
            if len(self.buf) < end + 4 + length:
                break
            del self.buf[: end + 4 + length]
            answers += 1
        if self.transport is not None:
            if answers:
                self.transport.write(RESPONSE * answers)
            if len(self.buf) > MAX_HEAD and b"\r\n\r\n" not in self.buf:
                self.transport.close()  # a head that never ends


async def serve_upstream(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Upstream, "127.0.0.1", port, backlog=1024)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()


# -- child processes ------------------------------------------------------------------------


class ChildError(RuntimeError):
    """A child process did not start or did not listen."""


def _die_with_parent() -> None:
    # Linux: the child gets SIGTERM should the bench die without cleaning up (SIGKILL).
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Child:
    """One child process (the upstream, mitmdump, ctrlrun proxy); its output goes to files."""

    def __init__(self, label: str, argv: list[str], workdir: Path, env: dict[str, str]) -> None:
        self.label = label
        self.out, self.err = workdir / f"{label}.out", workdir / f"{label}.log"
        with self.out.open("w") as out, self.err.open("w") as err:
            # A session of its own: a Ctrl-C on the terminal reaches only the bench, which
            # then stops its children itself, in order.
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd=workdir,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_for_line(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if found := pattern.search(self.out.read_text()):
                return found
            time.sleep(0.05)
        raise ChildError(f"{self.label} did not start: {self.tail()}")

    def wait_for_port(self, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            with socket.socket() as sock:
                sock.settimeout(0.5)
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.05)
        raise ChildError(f"{self.label} did not listen on {port}: {self.tail()}")

    def tail(self) -> str:
        code = self.proc.poll()
        text = (self.out.read_text() + self.err.read_text()).strip()[-1500:]
        return (f"(exited {code}) " if code is not None else "") + text

    def cpu_seconds(self) -> float | None:
        """User + system CPU of the process, all threads (Linux ``/proc``), else None."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each live thread of ``pid`` (Linux ``/proc``; else {})."""
    out: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
                out[int(tid)] = (int(stat[11]) + int(stat[12])) / tick
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env() -> dict[str, str]:
    """This environment without proxy variables (no loops) or a deployment's CTRLRUN_*."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.lower().endswith("_proxy") and not k.startswith("CTRLRUN_")
    }


def find_tool(name: str) -> str | None:
    """A console script beside this interpreter (its venv), else on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


# -- py-spy ---------------------------------------------------------------------------------


PACKAGES = {  # the first folder of a frame's file -> the package named in the profile
    "sdk": "ctrlrun",
    "proxy": "ctrlrun.proxy",
    "reconcilers": "ctrlrun.reconcilers",
    "concurrent": "concurrent.futures",
}


LOOP = "BaseEventLoop.run_forever ("


@dataclass
class Recording:
    """What ``py_spy`` recorded: py-spy's collapsed stacks, or why there are none."""

    stacks: str | None = None
    error: str | None = None


@contextlib.contextmanager
def py_spy(pid: int, seconds: float, output: Path) -> Iterator[Recording]:
    """Sample ``pid`` with py-spy for ``seconds`` while the block runs: every thread, but only
    while it holds the GIL (``--gil``), so the samples are Python work, not waiting."""
    rec = Recording()
    spy = find_tool("py-spy")
    if spy is None:
        rec.error = "py-spy not found (pip install py-spy): no samples"
        yield rec
        return
    argv = [
        spy,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(int(seconds)),
        "--output",
        str(output),
        *["--rate", "250", "--format", "raw", "--threads", "--gil", "--nonblocking"],
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        yield rec
        _, err = proc.communicate(timeout=seconds + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if output.exists():
        rec.stacks = output.read_text()
    else:
        rec.error = f"py-spy recorded nothing: {err.strip()[-500:]}"


def _frame(text: str, repo: Path) -> tuple[str, str]:
    """``name (path/to/file.py:123)`` -> (``name (pkg/file.py)``, package): by function."""
    m = re.match(r"(.*) \((.*?)(?::\d+)?\)$", text)
    if not m:
        return text, "?"
    name, path = m.groups()
    path = re.sub(r".*/(site-packages|lib/python3\.\d+)/", "", path).removeprefix(f"{repo}/")
    top = path.split("/", 1)[0].removesuffix(".py")
    package = PACKAGES.get(top, top)
    if path.startswith("<frozen importlib"):
        package = "importlib"
    return f"{name} ({path})", package


def _thread(root: str) -> str:
    """py-spy's ``thread (TID): NAME`` root frame -> what that thread does in the proxy."""
    name = root.rpartition(": ")[2]
    if name == "MainThread":
        return "event loop (main thread)"
    if name.startswith("asyncio_"):  # asyncio's default executor: asyncio.to_thread
        return "asyncio.to_thread workers (the ledger)"
    return "other threads"


def fold(text: str, top: int, repo: Path) -> dict[str, Any]:
    """Sample shares from py-spy's collapsed stacks (``--threads``): per thread, per package
    and function of the sampled frame, and per ctrlrun function with what it calls."""
    threads: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    own: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        root = frames.pop(0) if frames[0].startswith("thread (") else ""
        if not frames or not n.isdigit():
            continue
        count, named = int(n), [_frame(f, repo) for f in frames]
        total += count
        threads[_thread(root)] += count
        own[named[-1][0]] += count
        packages[named[-1][1]] += count
        # What calls the event loop (the CLI command, ``serve``) is under every sample of the
        # main thread: count ctrlrun's frames from the loop on.
        loop = next((i for i, (f, _) in enumerate(named) if f.startswith(LOOP)), -1)
        for name in {f for f, pkg in named[loop + 1 :] if pkg.startswith("ctrlrun")}:
            ours[name] += count

    def share(c: Counter[str]) -> list[tuple[str, float]]:
        return [(k, round(100 * v / total, 1)) for k, v in c.most_common(top)] if total else []

    return {
        "samples": total,
        "threads": share(threads),
        "packages": share(packages),
        "ctrlrun_inclusive": share(ours),
        "own": share(own),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the tiny upstream of bench_proxy.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("upstream", help="answer 200 to every request, on 127.0.0.1")
    up.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    asyncio.run(serve_upstream(args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
