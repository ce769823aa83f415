"""Before the guard: where a CONNECT or a request really goes, and whether it may go there.

::

    destination   resolved (any spelling, any literal form) and compared with the upstreams
      an upstream's address and port     guarded: the tunnel is intercepted, the request is
                                         that upstream's, whatever name it was written with
      Host or SNI disagree about that    refused (destination_mismatch)
      no upstream, egress allows it      passed through, dialled at the address just checked
      no upstream, egress denies it      refused (egress_denied), naming the host
      does not resolve                   refused (unresolvable)
      the sidecar's own proxy or admin   refused (own_listener): its port on any address of
      listener                           this host, however spelt; a hop back into the
                                         proxy, or to what only the host should reach

Every refusal writes a receipt first (``receipted``). In observe mode the receipt says
``observed`` and the request goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ctrlrun.action import Principal
from ctrlrun.control import Control

from . import receipted
from .config import Upstream
from .egress import Egress
from .hosts import LOOPBACK, normalize
from .recognize import Destination, Recognizer
from .refusals import Refusal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Passage:
    """What the gate lets through: to an upstream (guarded), to an address, or refused."""

    upstream: Upstream | None = None
    dial: str | None = None  # pin the connection to this address (a pass-through)
    refusal: Refusal | None = None


@dataclass(frozen=True)
class Asked:
    """One CONNECT or request, as the gate needs it."""

    method: str
    host: str
    port: int
    path: str = ""
    names: Sequence[str] = ()  # the Host header's host and the SNI, as the client sent them
    principal: Principal | None = None
    egress_host: str | None = None  # the host egress judges (a tunnel's: its CONNECT's)


class Gate:
    """Recognition and egress for every flow, guarded or not."""

    def __init__(
        self,
        recognizer: Recognizer,
        control: Callable[[], Control],
        egress: Callable[[], Egress],
    ) -> None:
        self.recognizer, self.control, self.egress = recognizer, control, egress
        self.own_ports: set[int] = set()  # the proxy's and admin's, once they are bound

    async def passage(self, asked: Asked) -> Passage:
        dest = await self.recognizer.destination(asked.host, asked.port)
        if dest.refused is not None:
            return await self._refuse(asked, dest, "unresolvable", dest.refused)
        for name in asked.names:
            if normalize(name) == normalize(asked.host):
                continue
            if not await self.recognizer.same_place(name, asked.port, dest.upstream):
                line = (
                    f"{asked.method} to {normalize(asked.host)}:{asked.port} names {name!r}: "
                    "the destination, Host and SNI must name the same server"
                )
                return await self._refuse(asked, dest, "destination_mismatch", line)
        if dest.upstream is not None:
            return Passage(upstream=dest.upstream)
        if asked.port in self.own_ports and await self._local(asked.host):
            line = (
                f"{asked.method} to {normalize(asked.host)}:{asked.port} refused: that is "
                "this sidecar's own listener"
            )
            return await self._refuse(asked, dest, "own_listener", line)
        egress, host = self.egress(), asked.egress_host or asked.host
        if not egress.allows(host):
            line = egress.refusal_line(host, asked.port)
            return await self._refuse(asked, dest, "egress_denied", line)
        return Passage(dial=dest.dial)

    async def _local(self, host: str) -> bool:
        """Whether ``host`` reaches this host's own listeners (a loopback or own address)."""
        try:
            return LOOPBACK in await self.recognizer.addresses(normalize(host))
        except OSError:
            return False  # resolves nowhere: reaches no listener of ours

    async def _refuse(self, asked: Asked, dest: Destination, reason: str, line: str) -> Passage:
        ctl = self.control()
        observed = ctl.policy.mode == "observe"
        upstream = dest.upstream.name if dest.upstream else None
        action = receipted.refusal_action(
            f"proxy.{reason}",
            method=asked.method,
            upstream=upstream,
            path=asked.path,
            principal=asked.principal,
            environment=ctl.environment,
            host=f"{normalize(asked.host)}:{asked.port}",
        )
        refusal = await receipted.write(
            ctl, Refusal("denied", reason, line), action, observed=observed
        )
        if observed:
            log.warning("observe mode: would refuse %s: %s", asked.method, line)
            return Passage(upstream=dest.upstream, dial=dest.dial)
        log.info("refused %s %s: %s", asked.method, normalize(asked.host), line)
        return Passage(upstream=dest.upstream, refusal=refusal)
