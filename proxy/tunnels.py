"""Which connections mitmproxy intercepts: every one that reaches, or names, an upstream.

mitmproxy's ``allow_hosts`` matches the spelling of a host, so ``127.1`` or the upstream's IP
would be tunnelled untouched past the guard. This replaces the rule (``next_layer``'s
"ignore this connection?") with the recogniser's: a connection whose destination is an
upstream's address and port, or whose SNI or Host names an upstream, is intercepted (TLS is
terminated, requests go through the addon, which guards or refuses them); every other
connection is tunnelled untouched, so the agent's other sites need no CA.

An intercepted connection is never relayed as raw TCP: mitmproxy relays bytes that do not
look like HTTP to it ("\r\nPOST ..." starts with no letter) untouched, and a server that
skips leading blank lines, as RFC 9112 allows and Go's does, would run that request unguarded.
Such bytes are parsed as HTTP instead, so they meet the guard or are refused as malformed.
(A relay after a ``101 Switching Protocols`` the guard decided is not chosen here.)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from mitmproxy.addons.next_layer import NextLayer
from mitmproxy.net.http.url import parse_authority
from mitmproxy.proxy import layer, layers
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers.http import HTTPMode
from mitmproxy.proxy.mode_specs import TransparentMode

from .recognize import Recognizer


class GuardedNextLayer(NextLayer):
    """mitmproxy's ``NextLayer`` with the interception rule of the recogniser."""

    name = "nextlayer"  # the name mitmproxy's proxy server looks it up by

    def __init__(
        self, recognizer: Recognizer, inspect_transparent: Callable[[], bool] = lambda: False
    ) -> None:
        super().__init__()
        self.recognizer = recognizer
        # Transparent connections have no CONNECT for the gate to judge: while egress denies,
        # every one is intercepted, so that its requests meet the gate (a tunnel would not).
        self.inspect_transparent = inspect_transparent

    def _next_layer(
        self, context: Context, data_client: bytes, data_server: bytes
    ) -> layer.Layer | None:
        chosen = super()._next_layer(context, data_client, data_server)
        if not isinstance(chosen, layers.TCPLayer) or chosen.flow is None:
            return chosen  # not raw, or a tunnel left untouched (not an upstream's)
        # Intercepted and about to be relayed raw. Explicit mode intercepts only what reaches
        # or names an upstream; transparent mode also inspects other hosts while egress
        # denies, and their non-HTTP protocols stay raw (the addon's tcp_start judges them).
        transparent = isinstance(context.client.proxy_mode, TransparentMode)
        if not transparent or self._reaches_upstream(context):
            return layers.HttpLayer(context, HTTPMode.transparent)
        return chosen

    def _reaches_upstream(self, context: Context) -> bool:
        if not context.server.address:
            return False
        host, port = context.server.address[:2]
        sni = context.client.sni
        return self.recognizer.known(str(host), int(port)) is not None or bool(
            sni and self.recognizer.names_upstream(_host(str(sni)), int(port))
        )

    def _ignore_connection(
        self, context: Context, data_client: bytes, data_server: bytes
    ) -> bool | None:
        if not context.server.address:
            return False  # no destination yet (the proxy's own first layer)
        host, port = context.server.address[:2]
        if self.recognizer.known(str(host), int(port)) is not None:
            return False
        if not self.recognizer.resolved(str(host)):
            # A CONNECT to a pass-through is pinned to the address it was judged by; a name
            # left here was an upstream's, or was never judged. Its lookup has expired (the
            # agent waited before sending), so nothing says it is not an upstream: intercepted,
            # its requests meet the gate, which resolves it again.
            return False
        names: list[Any] = [self._get_host_header(context, data_client, data_server)]
        absolute = _absolute(data_client)  # a server reads that name, not the Host header
        if absolute and self.recognizer.names_upstream(*absolute):
            return False
        names.append(absolute[0] if absolute else None)
        hello = self._get_client_hello(context, data_client)  # NeedsMoreData: asked again
        names += [hello.sni if hello else None, context.client.sni]
        for name in names:
            if name and self.recognizer.names_upstream(_host(str(name)), int(port)):
                return False  # intercepted, so the addon sees the mismatch and refuses it
        transparent = isinstance(context.client.proxy_mode, TransparentMode)
        return not (transparent and self.inspect_transparent())


# A request line in absolute-form ("POST http://api.stripe.com/v1/refunds HTTP/1.1"): RFC 9112
# has a server read its authority and ignore the Host header.
_ABSOLUTE = re.compile(rb"[A-Za-z]+[ \t]+([A-Za-z][A-Za-z0-9+.-]*)://([^/?#\s]*)")


def _absolute(data: bytes) -> tuple[str, int] | None:
    """The host and port of a request line in absolute-form (userinfo dropped), or None."""
    found = _ABSOLUTE.match(data.lstrip(b"\r\n"))
    if found is None:
        return None
    authority = found[2].decode("utf-8", "surrogateescape").rsplit("@", 1)[-1]
    try:
        host, port = parse_authority(authority, check=False)
    except ValueError:
        return (authority, 0)
    return host, port or (443 if found[1].lower() == b"https" else 80)


def _host(authority: str) -> str:
    if authority.startswith("["):
        return authority[1 : authority.find("]")] if "]" in authority else authority
    return authority.rsplit(":", 1)[0] if authority.count(":") == 1 else authority


def host_of(authority: str | None) -> str | None:
    """The host an authority (a Host header, a CONNECT target) names, or None."""
    if not authority:
        return None
    try:
        return parse_authority(authority, check=False)[0]
    except ValueError:
        return authority
