"""The ``egress:`` section: where an agent may go through the proxy besides its upstreams.

    egress:
      default: deny                 # deny | allow (the section's default is deny)
      allow: [api.openai.com, "*.anthropic.com", 10.0.0.7]

A host is matched as the resolver reads it (lower case, no trailing dot, an IP literal in any
form as its address); ``*.example.com`` matches every name under ``example.com``, not the name
itself. Upstreams are never egress: they are guarded wherever they are reached. A policy
without the section passes everything else through (the README's limits say why).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ctrlrun.yamlstrict import Where, YamlList, check_keys, expect_choice, expect_map, show

from .hosts import literal, normalize

EGRESS_KEYS = ("default", "allow")


@dataclass(frozen=True)
class Egress:
    """The egress rule: a default and the hosts allowed past it."""

    default: Literal["allow", "deny"] = "allow"
    allow: tuple[str, ...] = ()

    def allows(self, host: str) -> bool:
        if self.default == "allow":
            return True
        name = normalize(host)
        address = literal(name, own=False)  # the pod's address allows no loopback listener
        for entry in self.allow:
            if entry.startswith("*."):
                if name.endswith(entry[1:]) and address is None:
                    return True
            elif entry == name or (address is not None and literal(entry, own=False) == address):
                return True
        return False

    def refusal_line(self, host: str, port: int) -> str:
        return (
            f"egress to {normalize(host)}:{port} refused: not an upstream and not in egress.allow"
        )


def parse_egress(value: Any, where: Where) -> Egress:
    entry = expect_map(value, where)
    check_keys(entry, where, EGRESS_KEYS)
    default = expect_choice(
        entry.get("default", "deny"), where.key(entry, "default"), ("deny", "allow")
    )
    hosts: list[str] = []
    if "allow" in entry:
        items = entry["allow"]
        at = where.key(entry, "allow")
        if not isinstance(items, YamlList):
            raise at.error(f"must be a list of hosts, got {show(items)}")
        for i, item in enumerate(items):
            hosts.append(_host(item, at.index(items, i)))
    return Egress("allow" if default == "allow" else "deny", tuple(hosts))


def _host(value: Any, where: Where) -> str:
    if not isinstance(value, str) or not value.strip():
        raise where.error(f"must be a host name, '*.domain' or an address, got {show(value)}")
    text = normalize(value)
    bare = text[2:] if text.startswith("*.") else text
    if (
        not bare
        or "*" in bare
        or "/" in bare
        or " " in bare
        or (":" in bare and literal(bare) is None)
    ):
        raise where.error(f"must be a host name, '*.domain' or an address, got {value!r}")
    return text
