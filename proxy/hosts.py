"""Hosts as the resolver reads them, and addresses in the form they are compared in.

IPv4-mapped IPv6 is its IPv4 address, and every loopback or unspecified address is one:
``0.0.0.0``, ``::``, ``::1`` and any ``127/8`` reach the same local listeners.
"""

from __future__ import annotations

import ipaddress
import socket

LOOPBACK = "loopback"  # the canonical form of every loopback and unspecified address


def normalize(host: str) -> str:
    """A host as the resolver reads it: lower case, no brackets, no trailing dot."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host.rstrip(".") if host not in (".", "") else host


def canonical(address: str) -> str | None:
    """An address in the form addresses are compared in; None for anything not an address."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback or ip.is_unspecified:
        return LOOPBACK
    return str(ip)


def literal(host: str) -> str | None:
    """The canonical address of an IP literal in any form ``connect`` accepts, else None."""
    host = normalize(host)
    found = canonical(host)
    if found is not None or ":" in host:
        return found
    try:
        # inet_aton reads what getaddrinfo reads for IPv4: 127.1, 0x7f.1, 017700000001, 2130706433
        return canonical(socket.inet_ntoa(socket.inet_aton(host)))
    except OSError:
        return None
