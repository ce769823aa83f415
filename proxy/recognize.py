"""Where a request really goes: its destination compared with every upstream's addresses.

An upstream is recognised by the addresses it resolves to and its port, never by how the
agent spelt it: ``LOCALHOST.``, ``127.1``, ``2130706433``, ``0x7f.0.0.1``, ``[::ffff:127.0.0.1]``
and ``[::1]`` all reach a server on ``127.0.0.1``. Every name and literal goes through the
system resolver (``getaddrinfo``, which reads the legacy IPv4 forms exactly as ``connect``
will), on the event loop's executor, cached for ``ttl`` seconds. Addresses are compared in a
canonical form: IPv4-mapped IPv6 is its IPv4 address, and every loopback or unspecified
address is one (``0.0.0.0`` and any ``127/8`` reach the same local listeners).

``destination`` answers a :class:`Destination`: the upstream the address belongs to (or
none), the address to dial for a pass-through (pinned, so a name that resolves elsewhere a
moment later cannot move the connection onto a guarded address), or why it is refused.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from .config import Upstream
from .hosts import canonical, literal, normalize

log = logging.getLogger(__name__)

DEFAULT_TTL = 30.0
NEGATIVE_TTL = 5.0
MAX_CACHED = 4096
MAX_ADDRESSES = 256  # addresses remembered per upstream
# In-cluster names of the API server: with $KUBERNETES_SERVICE_HOST they are one upstream.
CLUSTER_NAMES = ("kubernetes", "kubernetes.default", "kubernetes.default.svc")
CLUSTER_SUFFIX = ".svc.cluster.local"

Resolve = Callable[[str], Awaitable[tuple[str, ...]]]


def cluster_aliases(up: Upstream, environ: Mapping[str, str]) -> tuple[str, ...]:
    """Extra addresses of an in-cluster Kubernetes upstream: the service's address from the
    environment, when the upstream names the service (or that address) and its port."""
    service = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "443")
    if up.profile != "kubernetes" or not service or not port.isdigit():
        return ()
    host = normalize(up.host)
    names_service = host in CLUSTER_NAMES or host.endswith(CLUSTER_SUFFIX)
    if not (names_service or literal(host) == literal(service)) or int(port) != up.port:
        return ()
    address = literal(service)
    return (address,) if address else ()


@dataclass(frozen=True)
class Destination:
    """Where a host:port goes: a guarded upstream, a pass-through address, or a refusal."""

    upstream: Upstream | None = None
    dial: str | None = None  # the address a pass-through connects to (None: as written)
    refused: str | None = None  # one line saying why nothing may go there

    @property
    def guarded(self) -> bool:
        return self.upstream is not None


async def system_resolve(host: str) -> tuple[str, ...]:
    """Every address ``host`` resolves to, from the resolver in a worker thread."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return tuple(dict.fromkeys(str(info[4][0]) for info in infos))


class Recognizer:
    """Resolves destinations (cached) and says which upstream, if any, each one reaches."""

    def __init__(
        self,
        upstreams: Sequence[Upstream],
        *,
        resolve: Resolve = system_resolve,
        ttl: float | None = None,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.upstreams = tuple(upstreams)
        self._resolve, self._clock = resolve, clock
        self.ttl = DEFAULT_TTL if ttl is None else ttl
        env = os.environ if environ is None else environ
        self._names = {(normalize(u.host), u.port): u for u in self.upstreams}
        self._hosts = {normalize(u.host) for u in self.upstreams}
        # Its own addresses (a literal url, the in-cluster service), and the newest
        # ``MAX_ADDRESSES`` it has resolved to, oldest first: an address it had a minute ago
        # still reaches it for whoever kept it, and what it resolves to now always does.
        self._own: dict[str, frozenset[str]] = {}
        for up in self.upstreams:
            address = literal(up.host)
            self._own[up.name] = frozenset(
                (*cluster_aliases(up, env), *([address] if address else []))
            )
        self._mine: dict[str, dict[str, None]] = {u.name: {} for u in self.upstreams}
        self._cache: dict[str, tuple[float, tuple[str, ...], tuple[str, ...]]] = {}
        self._pending: dict[str, asyncio.Future[tuple[str, ...]]] = {}
        self._unresolved: set[str] = set()
        # Names seen to reach an upstream stay that upstream for ``known`` (bounded): a
        # tunnel opened to one must not become unguarded when its cache entry expires.
        self._learned: dict[tuple[str, int], Upstream] = {}
        self._decided: dict[tuple[str, int], tuple[float, Destination]] = {}

    def names_upstream(self, host: str, port: int) -> bool:
        """Whether ``host`` (an SNI or a Host header's host) names an upstream at ``port``,
        from what is already resolved (never waits)."""
        name = normalize(host)
        if (name, port) in self._names or (name, port) in self._learned:
            return True
        address = literal(name)
        cached = (address,) if address else self._cached(name)
        return bool(self._owners(cached or (), port))

    def resolved(self, host: str) -> bool:
        """Whether where ``host`` goes is known now (never waits): a literal, or a name whose
        lookup has not expired. A tunnel's host that is neither must be intercepted: once its
        lookup expired (and ``known`` had no room left to learn it), a name that reaches an
        upstream would no longer be known to."""
        name = normalize(host)
        return literal(name) is not None or self._cached(name) is not None

    def known(self, host: str, port: int) -> Upstream | None:
        """The upstream ``host:port`` reaches, from what is already resolved (never waits)."""
        name = normalize(host)
        if (name, port) in self._names:
            return self._names[name, port]
        if (name, port) in self._learned:
            return self._learned[name, port]
        address = literal(name)
        owners = self._owners((address,) if address else self._cached(name) or (), port)
        return owners[0] if len(owners) == 1 else None

    async def destination(self, host: str, port: int) -> Destination:
        """Where a request or CONNECT to ``host:port`` really goes (answers cached for ttl)."""
        name = normalize(host)
        if (name, port) in self._names:
            return Destination(upstream=self._names[name, port])
        decided = self._decided.get((name, port))
        if decided is not None and decided[0] > self._clock():
            return decided[1]
        found = await self._destination(name, port)
        if found.refused is None:
            if len(self._decided) >= MAX_CACHED:
                self._decided.clear()  # rare; refilled from the resolver's own cache
            self._decided[name, port] = (self._clock() + self.ttl, found)
        return found

    async def _destination(self, name: str, port: int) -> Destination:
        await self.refresh()
        try:
            found = await self.addresses(name)
        except OSError as exc:
            return Destination(refused=f"cannot resolve {name}: {exc.strerror or exc}")
        owners = self._owners(found, port)
        if len(owners) > 1:
            listed = ", ".join(u.name for u in owners)
            return Destination(refused=f"{name}:{port} is the address of upstreams {listed}")
        if owners:
            if len(self._learned) < MAX_CACHED:
                self._learned[name, port] = owners[0]
            return Destination(upstream=owners[0])
        entry = self._cache.get(name)
        return Destination(dial=entry[2][0] if entry and entry[2] else None)

    async def same_place(self, host: str, port: int, expected: Upstream | None) -> bool:
        """Whether ``host`` (a Host header's or the SNI) names what the connection reaches."""
        got = await self.destination(host, port)
        if got.refused:
            # A name that resolves nowhere reaches nothing: only a guarded request minds it.
            return expected is None
        return got.upstream is expected

    async def addresses(self, name: str) -> tuple[str, ...]:
        """The canonical addresses of ``name`` (a literal needs no lookup); OSError if none."""
        address = literal(name)
        if address is not None:
            return (address,)
        cached = self._cached(name)
        if cached is not None:
            if not cached:
                raise OSError(f"{name} does not resolve")
            return cached
        pending = self._pending.get(name)
        if pending is None:
            pending = asyncio.ensure_future(self._lookup(name))
            self._pending[name] = pending
        return await asyncio.shield(pending)

    async def refresh(self) -> None:
        """Resolve the upstreams' hosts where the cache is stale (usually none is)."""
        for up in self.upstreams:
            name = normalize(up.host)
            if literal(name):
                continue
            try:
                found = await self.addresses(name)
            except OSError as exc:
                if up.name not in self._unresolved:
                    self._unresolved.add(up.name)
                    log.warning("upstream %s: %s does not resolve: %s", up.name, up.host, exc)
                continue
            self._unresolved.discard(up.name)
            mine = self._mine[up.name]
            for address in found:
                mine.pop(address, None)
                mine[address] = None  # the newest last
            while len(mine) > MAX_ADDRESSES:
                del mine[next(iter(mine))]  # the oldest goes

    async def _lookup(self, name: str) -> tuple[str, ...]:
        try:
            raw = await self._resolve(name)
        except OSError:
            self._store(name, (), (), NEGATIVE_TTL)
            raise
        finally:
            self._pending.pop(name, None)
        found = tuple(dict.fromkeys(a for a in map(canonical, raw) if a))
        self._store(name, found, raw, self.ttl if found else NEGATIVE_TTL)
        if not found:
            raise OSError(f"{name} does not resolve")
        return found

    def _store(self, name: str, found: tuple[str, ...], raw: tuple[str, ...], ttl: float) -> None:
        if len(self._cache) >= MAX_CACHED:
            self._cache.pop(min(self._cache, key=lambda k: self._cache[k][0]))
        self._cache[name] = (self._clock() + ttl, found, raw)

    def _cached(self, name: str) -> tuple[str, ...] | None:
        entry = self._cache.get(name)
        if entry is None or entry[0] <= self._clock():
            return None
        return entry[1]

    def _owners(self, found: Sequence[str], port: int) -> list[Upstream]:
        """The upstreams whose addresses (and port) ``found`` reaches."""
        return [
            u
            for u in self.upstreams
            if u.port == port
            and any(a in self._own[u.name] or a in self._mine[u.name] for a in found)
        ]
