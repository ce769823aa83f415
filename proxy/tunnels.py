"""Which connections mitmproxy intercepts: every one that reaches, or names, an upstream.

mitmproxy's ``allow_hosts`` matches the spelling of a host, so ``127.1`` or the upstream's IP
would be tunnelled untouched past the guard. This replaces the rule (``next_layer``'s
"ignore this connection?") with the recogniser's: a connection whose destination is an
upstream's address and port, or whose SNI or Host names an upstream, is intercepted (TLS is
terminated, requests go through the addon, which guards or refuses them); every other
connection is tunnelled untouched, so the agent's other sites need no CA.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mitmproxy.addons.next_layer import NextLayer
from mitmproxy.proxy.context import Context
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

    def _ignore_connection(
        self, context: Context, data_client: bytes, data_server: bytes
    ) -> bool | None:
        if not context.server.address:
            return False  # no destination yet (the proxy's own first layer)
        host, port = context.server.address[:2]
        if self.recognizer.known(str(host), int(port)) is not None:
            return False
        names: list[Any] = [self._get_host_header(context, data_client, data_server)]
        hello = self._get_client_hello(context, data_client)  # NeedsMoreData: asked again
        names += [hello.sni if hello else None, context.client.sni]
        for name in names:
            if name and self.recognizer.names_upstream(_host(str(name)), int(port)):
                return False  # intercepted, so the addon sees the mismatch and refuses it
        transparent = isinstance(context.client.proxy_mode, TransparentMode)
        return not (transparent and self.inspect_transparent())


def _host(authority: str) -> str:
    if authority.startswith("["):
        return authority[1 : authority.find("]")] if "]" in authority else authority
    return authority.rsplit(":", 1)[0] if authority.count(":") == 1 else authority


def install(
    master: Any, recognizer: Recognizer, inspect_transparent: Callable[[], bool] = lambda: False
) -> None:
    """Put the guarded rule in place of mitmproxy's own next-layer addon."""
    master.addons.remove(master.addons.get("nextlayer"))
    master.addons.add(GuardedNextLayer(recognizer, inspect_transparent))
