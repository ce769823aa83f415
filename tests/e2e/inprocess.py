"""``ctrlrun proxy`` in this process: the server module run in a thread, for end-to-end tests
where a subprocess adds nothing but its start-up time.

It is the same code the command runs (``server.run``: mitmproxy's master, the addon, the
admin listener, the sweep) on real loopback sockets; only signals are not installed (a thread
cannot take them), so a reload is asked for on the loop. mitmproxy keeps its master in module
globals, so at most one runs per process at a time: starting a second one is refused.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from click.testing import CliRunner

from ctrlrun.proxy import server

_ONE = threading.Lock()
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # as ``ctrlrun proxy`` logs


class InProcess:
    """One sidecar running in a thread of this process."""

    def __init__(self, settings: server.ProxySettings, log: Path, env: dict[str, str]) -> None:
        self.settings, self.log, self.env = settings, log, env
        self.line = ""
        self.error: BaseException | None = None
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._saved_env: dict[str, str | None] = {}
        self._handler: logging.Handler | None = None
        self._level = logging.NOTSET
        self._holding = False

    def start(self, timeout: float = 30) -> str:
        """Start it; return its start-up line once every listener is bound."""
        if not _ONE.acquire(blocking=False):
            raise RuntimeError("an in-process sidecar is already running (one per process)")
        self._holding = True
        try:
            self._enter_env_and_log()
            self.sidecar = server.Sidecar(self.settings)
            self._thread = threading.Thread(target=self._main, name="ctrlrun-proxy", daemon=True)
            self._thread.start()
            if not self._started.wait(timeout) or not self.line:
                raise AssertionError(f"proxy did not start: {self.error!r}")
        except BaseException:
            self.stop()
            raise
        return self.line

    def reload(self) -> None:
        """What SIGHUP does: load the policy again, on the proxy's loop."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.sidecar.reload)

    def stop(self) -> int:
        """What SIGTERM does: finish in-flight protected requests, then stop."""
        try:
            if self._loop is not None and self._stopping is not None:
                self._loop.call_soon_threadsafe(self._stopping.set)
            if self._thread is not None:
                self._thread.join(60)
                assert not self._thread.is_alive(), "the in-process proxy did not stop"
            if hasattr(self, "sidecar"):
                self.sidecar.store.close()
        finally:
            self._leave_env_and_log()
            if self._holding:
                self._holding = False
                _ONE.release()
        return 0 if self.error is None else 1

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # reported by start() or stop(), never lost
            self.error = exc
        finally:
            self._started.set()

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        await server.run(
            self.sidecar, stopping=self._stopping, signals=False, announce=self._announced
        )

    def _announced(self, line: str) -> None:
        self.line = line
        self._started.set()

    def _enter_env_and_log(self) -> None:
        # The reconcilers read credentials from the environment when they ask, as in the
        # command: the variables stay set while the sidecar runs.
        for name, value in self.env.items():
            self._saved_env[name] = os.environ.get(name)
            os.environ[name] = value
        self._handler = logging.FileHandler(self.log)
        self._handler.setFormatter(logging.Formatter(_FORMAT))
        root = logging.getLogger("ctrlrun")
        self._level = root.level
        root.setLevel(logging.INFO)
        root.addHandler(self._handler)

    def _leave_env_and_log(self) -> None:
        if self._handler is not None:
            root = logging.getLogger("ctrlrun")
            root.removeHandler(self._handler)
            root.setLevel(self._level)
            self._handler.close()
            self._handler = None
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env = {}


def cli(args: Sequence[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A ``ctrlrun`` command run in this process (click's runner), as a finished process."""
    from ctrlrun.cli import main

    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=True)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a traceback the command would have printed: a failure
    return subprocess.CompletedProcess(
        ["ctrlrun", *args], result.exit_code, result.stdout, result.stderr
    )
