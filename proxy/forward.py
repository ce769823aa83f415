"""Forwarding a protected request upstream with the addon's own client.

mitmproxy has no upstream read deadline and cannot tell whether request bytes were written;
this client can. It says exactly how far a request got, which is what the classification
table needs. The client is :mod:`.h1`, a lean HTTP/1.1 pool.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass

from . import h1
from .classify import Transport
from .config import Upstream
from .h1 import HOP_BY_HOP
from .stripe_accounts import AccountBook, api_upstream

MAX_RESPONSE = 16 * 1024 * 1024


@dataclass(frozen=True)
class Forwarded:
    """What the remote sent back, or how far the request got when nothing (complete) did."""

    status: int | None
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    transport: Transport | None = None  # set when no status line arrived
    error: str | None = None  # one line, for the record
    cut_short: bool = False  # the status arrived, the body did not finish


def forward_headers(headers: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Drop hop-by-hop headers and every ``Ctrlrun-*`` header."""
    return [
        (k, v)
        for k, v in headers
        if k.lower() not in HOP_BY_HOP and not k.lower().startswith("ctrlrun-")
    ]


class Forwarder:
    """One :class:`h1.Pool` per upstream; it never reads proxy environment variables (no loops)."""

    def __init__(self, upstreams: Sequence[Upstream]) -> None:
        self._pools: dict[str, h1.Pool] = {}
        self.accounts = AccountBook()  # what Stripe said each key's own account is
        apis = (api for up in upstreams if (api := api_upstream(up)) is not None)
        for up in (*upstreams, *apis):
            context = ssl.create_default_context(cafile=up.ca_file) if up.ca_file else None
            self._pools[up.name] = h1.Pool(
                up.scheme,
                up.host,
                up.port,
                timeout=float(up.timeout),
                ssl_context=context,
                max_body=MAX_RESPONSE,
            )

    async def send(
        self,
        upstream: Upstream,
        method: str,
        path_and_query: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
    ) -> Forwarded:
        try:
            got = await self._pools[upstream.name].request(method, path_and_query, headers, body)
        except h1.RequestFailed as exc:
            return Forwarded(None, transport=exc.transport, error=exc.line)
        out = tuple((k, v) for k, v in got.headers if k.lower() not in HOP_BY_HOP)
        if got.error is not None:
            # The status line arrived: the outcome is known by status even if the body is cut.
            return Forwarded(got.status, out, b"", error=got.error, cut_short=True)
        return Forwarded(got.status, out, got.body)

    async def aclose(self) -> None:
        for pool in self._pools.values():
            await pool.aclose()
