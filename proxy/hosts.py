"""Hosts as the resolver reads them, and addresses in the form they are compared in.

IPv4-mapped IPv6 is its IPv4 address, and every loopback or unspecified address is one:
``0.0.0.0``, ``::``, ``::1`` and any ``127/8`` reach the same local listeners. So does every
address of this host's own interfaces (its LAN or pod address): a server listening on all
addresses, as most do, answers there what it answers on ``127.0.0.1``. An address is this
host's when a socket can be bound to it (the kernel's own test), asked again after ``LOCAL_TTL``
seconds, since interfaces come and go.
"""

from __future__ import annotations

import ipaddress
import socket
import time

LOOPBACK = "loopback"  # the canonical form of every loopback, unspecified and own address
LOCAL_TTL = 30.0
MAX_LOCAL = 4096
_local: dict[str, tuple[float, bool]] = {}  # address -> (until, whether it is this host's)


def normalize(host: str) -> str:
    """A host as the resolver reads it: lower case, no brackets, no trailing dot."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host.rstrip(".") if host not in (".", "") else host


def canonical(address: str, *, own: bool = True) -> str | None:
    """An address in the form addresses are compared in; None for anything not an address.

    ``own=False`` leaves this host's interface addresses as they are: where reaching one
    place must not allow reaching another (egress), the pod's address is not ``127.0.0.1``.
    """
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    zoned = "%" in address and ip.version == 6
    if ip.is_loopback or ip.is_unspecified or (own and _is_own(address if zoned else str(ip), ip)):
        return LOOPBACK
    return str(ip)


def _is_own(address: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``address`` (a zone id kept) is one of this host's interfaces' addresses."""
    now = time.monotonic()
    known = _local.get(address)
    if known is not None and known[0] > now:
        return known[1]
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    try:
        info = socket.getaddrinfo(address, 0, family, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind(info[0][4])
        own = True
    except OSError:
        own = False  # EADDRNOTAVAIL: not an address of this host (or no such zone)
    if len(_local) >= MAX_LOCAL:
        _local.clear()
    _local[address] = (now + LOCAL_TTL, own)
    return own


def literal(host: str, *, own: bool = True) -> str | None:
    """The canonical address of an IP literal in any form ``connect`` accepts, else None."""
    host = normalize(host)
    found = canonical(host, own=own)
    if found is not None or ":" in host:
        return found
    try:
        # inet_aton reads what getaddrinfo reads for IPv4: 127.1, 0x7f.1, 017700000001, 2130706433
        return canonical(socket.inet_ntoa(socket.inet_aton(host)), own=own)
    except OSError:
        return None
