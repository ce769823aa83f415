"""Running the sidecar: mitmproxy listeners, the addon, signals, the periodic sweep.

``ctrlrun proxy`` builds ``ProxySettings`` from its flags and calls ``check`` or ``serve``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ctrlrun.approval_expiry import expire_due
from ctrlrun.config import policy_path
from ctrlrun.control import Control
from ctrlrun.errors import CTRLRunError, PolicyError
from ctrlrun.reconcilers.sweep import sweep
from ctrlrun.store import StateStore, open_default_store

from . import registry
from .addon import CtrlrunAddon
from .admin import Admin
from .config import Upstream
from .config_parse import load_policy, proxy_config
from .forward import Forwarder
from .gate import Gate
from .guard import Guard
from .master import build as build_master
from .metrics import Metrics
from .notifier import Notifier
from .notify import NOTIFY
from .principal import Principals
from .recognize import Recognizer
from .stall import StallGuard

if TYPE_CHECKING:
    from mitmproxy.master import Master

log = logging.getLogger(__name__)
EXPIRE_INTERVAL = 5.0  # seconds between rounds of expiring unanswered approval requests


@dataclass(frozen=True)
class ProxySettings:
    """The flags of ``ctrlrun proxy``, parsed."""

    policy: str | None = None
    listen: tuple[str, int] = ("127.0.0.1", 8080)
    store_url: str | None = None
    principal: str | None = None
    admin: tuple[str, int] | None = None
    mode: str = "regular"  # or "transparent": mitmproxy's mode for the ``listen`` address
    confdir: str = "~/.mitmproxy"
    sweep_interval: float = 60.0
    reconcile_deadline: float = 10.0
    create_ledger: bool = False  # a new ledger even where one was created before and is gone


def parse_address(text: str, what: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:8080`` for IPv6) -> (host, port); raise PolicyError when bad."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise PolicyError(f"{what}: expected HOST:PORT, got {text!r}")
    return host, int(port)


class Sidecar:
    """The policy, the ledger and the guard of one running proxy."""

    def __init__(self, settings: ProxySettings) -> None:
        self.settings = settings
        self.policy_file = policy_path(settings.policy)
        self.policy = load_policy(self.policy_file)
        self.config = proxy_config(self.policy)
        self.store: StateStore = open_default_store(
            settings.store_url, self.policy_file, new=settings.create_ledger
        )
        self.control = Control(self.policy, self.store)
        self.upstreams: Sequence[Upstream] = self.config.upstreams
        self.egress = self.config.egress
        self.limits = self.config.limits
        self.principals = Principals(settings.principal, self.config.agents)
        self.reconcilers = registry.build(self.upstreams)
        self.hooks = self.policy.section(NOTIFY)
        for hook in self.hooks:
            hook.secret()  # a webhook whose secret is not set: a start-up error, not a surprise

    def reload(self) -> bool:
        """Load the policy file again; keep the old one in force if the new one fails."""
        try:
            policy = load_policy(self.policy_file)
        except CTRLRunError as exc:
            log.error("policy reload refused, the old policy stays in force: %s", exc)
            return False
        config = proxy_config(policy)
        if (config.upstreams, config.agents) != (self.config.upstreams, self.config.agents):
            log.warning("upstreams/agents changed: they take effect at the next restart")
        self.policy = policy
        self.egress, self.limits = config.egress, config.limits  # these take effect now
        self.control = Control(policy, self.store)
        log.info("policy reloaded from %s (%s)", self.policy_file, policy.policy_hash)
        return True

    def modes(self) -> tuple[list[str], dict[str, str]]:
        host, port = self.settings.listen
        modes = [f"{self.settings.mode}@{_bracket(host)}:{port}"]
        reverse: dict[str, str] = {}
        for up in self.upstreams:
            if up.listen:
                spec = f"reverse:{up.url}@{_bracket(up.listen[0])}:{up.listen[1]}"
                modes.append(spec)
                reverse[spec] = up.name
        return modes, reverse

    def check_listeners(self) -> None:
        addresses = [self.settings.listen] + [u.listen for u in self.upstreams if u.listen]
        if self.settings.admin:
            addresses.append(self.settings.admin)
        for host, port in addresses:
            if port == 0:
                continue
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((host, port))
                except OSError as exc:
                    raise PolicyError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def check(settings: ProxySettings) -> str:
    """Validate everything without serving; returns a one-line summary or raises."""
    sidecar = Sidecar(settings)
    try:
        sidecar.store.ping()
        sidecar.check_listeners()
        for up in sidecar.upstreams:
            if up.ca_file and not Path(up.ca_file).is_file():
                raise PolicyError(f"upstreams.{up.name}.ca_file: no such file {up.ca_file}")
        ca = ensure_ca(settings.confdir)
        return (
            f"ok: policy {sidecar.policy_file} ({len(sidecar.policy.actions)} actions, "
            f"{len(sidecar.upstreams)} upstreams), ledger {sidecar.store.location}, CA {ca}"
        )
    finally:
        sidecar.store.close()


def ensure_ca(confdir: str) -> Path:
    """Create mitmproxy's CA in ``confdir`` unless it exists; return the file clients trust.

    ``--check`` calls it, so an init step can hand agents the CA before the proxy serves.
    """
    from mitmproxy import certs

    path = Path(os.path.expanduser(confdir))
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    certs.CertStore.from_store(path, "mitmproxy", 2048)  # mitmproxy's basename and key size
    return path / "mitmproxy-ca-cert.pem"


def serve(settings: ProxySettings) -> int:
    sidecar = Sidecar(settings)
    sidecar.check_listeners()
    try:
        return asyncio.run(run(sidecar))
    finally:
        sidecar.store.close()


def _print_line(line: str) -> None:
    print(line, flush=True)


async def run(
    sidecar: Sidecar,
    *,
    stopping: asyncio.Event | None = None,
    signals: bool = True,
    announce: Callable[[str], None] = _print_line,
) -> int:
    """Serve until ``stopping`` is set (or, with ``signals``, until SIGTERM/SIGINT).

    ``announce`` gets the start-up line once every listener is bound. Without ``signals``
    (a proxy run in a thread, as the tests do) nothing is installed for SIGHUP either:
    call ``sidecar.reload`` on the loop instead.
    """
    stopping = stopping or asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(_quiet_cancellations)
    recognizer = Recognizer(sidecar.upstreams)
    await recognizer.refresh()  # the upstreams' addresses, before the first connection
    master, confdir, reverse = _master(sidecar, recognizer)
    forwarder = Forwarder(sidecar.upstreams)
    metrics = Metrics()
    guard = Guard(
        lambda: sidecar.control,
        forwarder,
        sidecar.reconcilers,
        reconcile_deadline=sidecar.settings.reconcile_deadline,
        metrics=metrics,
        limits=lambda: sidecar.limits,
    )
    admin = None
    if sidecar.settings.admin:
        admin = await Admin(lambda: sidecar.store, metrics).start(*sidecar.settings.admin)
    gate = _gate(sidecar, recognizer)
    addon = CtrlrunAddon(guard, gate, sidecar.upstreams, sidecar.principals, reverse)
    stall = StallGuard(lambda: sidecar.limits, lambda: master.addons.get("proxyserver").connections)
    master.addons.add(stall, addon, _Announce(sidecar, master, confdir, admin, announce, gate))
    if signals:
        loop.add_signal_handler(signal.SIGTERM, stopping.set)
        loop.add_signal_handler(signal.SIGINT, stopping.set)
        loop.add_signal_handler(signal.SIGHUP, sidecar.reload)
    notifier = _notifier(sidecar, metrics)
    runner = asyncio.create_task(master.run())
    sweeper = asyncio.create_task(_sweep_forever(sidecar))
    expirer = asyncio.create_task(_expire_forever(sidecar))
    waiter = asyncio.create_task(stopping.wait())
    await asyncio.wait({runner, waiter}, return_when=asyncio.FIRST_COMPLETED)
    await _drain(guard, sidecar)
    sweeper.cancel()
    expirer.cancel()
    waiter.cancel()
    if notifier is not None:
        await asyncio.to_thread(notifier.stop)
    if admin is not None:
        admin.close()
    master.shutdown()
    with contextlib.suppress(Exception):
        await runner
    await forwarder.aclose()
    log.info("ctrlrun proxy stopped")
    return 0


def _gate(sidecar: Sidecar, recognizer: Recognizer) -> Gate:
    """The gate, knowing the ports of the sidecar's own listeners (port 0: once bound)."""
    gate = Gate(recognizer, lambda: sidecar.control, lambda: sidecar.egress)
    given = (sidecar.settings.listen, sidecar.settings.admin)
    gate.own_ports.update(a[1] for a in given if a and a[1])
    return gate


def _master(sidecar: Sidecar, recognizer: Recognizer) -> tuple[Master, Path, dict[str, str]]:
    """mitmproxy's master with ctrlrun's listeners (inside the running loop, as it needs).

    Connections that reach or name an upstream are intercepted, by address; the rest are
    tunnelled untouched (``tunnels``).
    """
    confdir = Path(os.path.expanduser(sidecar.settings.confdir))
    confdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    modes, reverse = sidecar.modes()
    bundle = _trust_bundle(confdir, sidecar.upstreams)
    master = build_master(
        confdir, modes, recognizer, lambda: sidecar.egress.default == "deny", bundle
    )
    return master, confdir, reverse


async def _drain(guard: Guard, sidecar: Sidecar) -> None:
    """Let in-flight protected requests finish (bounded by their own deadlines)."""
    loop = asyncio.get_running_loop()
    deadline = (
        loop.time()
        + max((u.timeout for u in sidecar.upstreams), default=30)
        + sidecar.settings.reconcile_deadline
    )
    while guard.active and loop.time() < deadline:
        await asyncio.sleep(0.05)


def _quiet_cancellations(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
    # Stopping cancels mitmproxy's handlers of idle keep-alive connections; asyncio reports
    # each as an error with a traceback. They are the expected end of those connections.
    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    loop.default_exception_handler(context)


def _notifier(sidecar: Sidecar, metrics: Metrics) -> Notifier | None:
    if not sidecar.hooks:
        return None
    failed = metrics.notify_failures
    return Notifier(
        sidecar.store, sidecar.hooks, on_failure=lambda h: failed.labels(url=h.shown).inc()
    ).start()


async def _sweep_forever(sidecar: Sidecar) -> None:
    if sidecar.settings.sweep_interval <= 0 or not any(sidecar.reconcilers.values()):
        return
    while True:
        await asyncio.sleep(sidecar.settings.sweep_interval)
        try:
            settled = await asyncio.to_thread(sweep, sidecar.control, sidecar.reconcilers)
            for key, answer in settled:
                log.info("sweep: %s -> %s", key, answer)
        except Exception as exc:  # the sweep must never stop the proxy
            log.warning("sweep failed: %s", exc)


async def _expire_forever(sidecar: Sidecar) -> None:
    """Record unanswered approval requests as expired once their time is up (webhooks and
    the queue learn of it then, not when somebody next looks)."""
    failing = False  # a ledger outage is said once, not every round
    while True:
        await asyncio.sleep(EXPIRE_INTERVAL)
        try:
            for approval_id in await asyncio.to_thread(expire_due, sidecar.store):
                log.info("approval request %s expired unanswered", approval_id)
            failing = False
        except Exception as exc:  # the next round tries again
            if not failing:
                log.warning("expiring approval requests failed: %s", exc)
            failing = True


class _Announce:
    """Prints the one start-up line once mitmproxy's listeners are bound."""

    def __init__(
        self,
        sidecar: Sidecar,
        master: Master,
        confdir: Path,
        admin: asyncio.Server | None,
        announce: Callable[[str], None],
        gate: Gate,
    ) -> None:
        self.sidecar, self.master, self.confdir, self.admin = sidecar, master, confdir, admin
        self.announce, self.own_ports = announce, gate.own_ports  # filled once bound

    def running(self) -> None:
        server = self.master.addons.get("proxyserver")
        parts = []
        for instance in server.servers:
            addrs = ", ".join(f"{_bracket(a[0])}:{a[1]}" for a in instance.listen_addrs)
            spec = instance.mode.full_spec
            name = _listener_name(spec) or f"reverse {self.sidecar_name(spec)}"
            if _listener_name(spec):  # a reverse listener guards what reaches it: not refused
                self.own_ports.update(int(a[1]) for a in instance.listen_addrs)
            parts.append(f"{name} {addrs}")
        if self.admin is not None:
            host, port = self.admin.sockets[0].getsockname()[:2]
            self.own_ports.add(int(port))
            parts.append(f"admin {_bracket(host)}:{port}")
        ca = self.confdir / "mitmproxy-ca-cert.pem"
        key = self.confdir / "mitmproxy-ca.pem"
        with contextlib.suppress(OSError):
            os.chmod(key, 0o600)
        self.announce(f"ctrlrun proxy listening: {'; '.join(parts)}; CA {ca}")
        if self.sidecar.policy.mode == "observe":
            log.warning("OBSERVE MODE: nothing is enforced; refusals are only recorded")

    def sidecar_name(self, spec: str) -> str:
        _, reverse = self.sidecar.modes()
        return reverse.get(spec, spec)


def _trust_bundle(confdir: Path, upstreams: Sequence[Upstream]) -> Path | None:
    """certifi's roots plus every upstream ``ca_file``: mitmproxy's option replaces, not adds."""
    extra = [Path(u.ca_file) for u in upstreams if u.ca_file]
    if not extra:
        return None
    import certifi

    parts = [Path(certifi.where()).read_text()] + [p.read_text() for p in extra]
    bundle = confdir / "ctrlrun-upstream-ca.pem"
    bundle.write_text("\n".join(parts))
    ssl.create_default_context(cafile=str(bundle))  # fail now, not on the first request
    return bundle


def _listener_name(spec: str) -> str | None:
    if spec.startswith("regular"):
        return "proxy"
    if spec.startswith("transparent"):
        return "transparent proxy"
    return None


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host
