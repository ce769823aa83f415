"""Forwarding a protected request upstream with the addon's own client.

mitmproxy has no upstream read deadline and cannot tell whether request bytes were written;
this client can. It says exactly how far a request got, which is what the classification
table needs. The client is :mod:`.h1` (a lean HTTP/1.1 pool); an injected httpx transport
(tests) takes the httpx path instead.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import httpx

from ctrlrun.upstreams import Upstream

from . import h1
from .classify import Transport
from .h1 import HOP_BY_HOP

MAX_RESPONSE = 16 * 1024 * 1024


@dataclass(frozen=True)
class Reply:
    """What came back, or how far the request got when nothing (complete) came back."""

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
    """One connection pool per upstream; ignores proxy environment variables (no loops)."""

    def __init__(
        self, upstreams: Sequence[Upstream], *, transport: httpx.AsyncBaseTransport | None = None
    ):
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._pools: dict[str, h1.Pool] = {}
        for up in upstreams:
            context = ssl.create_default_context(cafile=up.ca_file) if up.ca_file else None
            if transport is None:
                self._pools[up.name] = h1.Pool(
                    up.scheme,
                    up.host,
                    up.port,
                    timeout=float(up.timeout),
                    ssl_context=context,
                    max_body=MAX_RESPONSE,
                )
                continue
            verify: ssl.SSLContext | bool = context or True
            self._clients[up.name] = httpx.AsyncClient(
                base_url=up.url,
                timeout=httpx.Timeout(float(up.timeout)),
                trust_env=False,
                verify=verify,
                follow_redirects=False,
                transport=transport,
                limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
            )

    async def send(
        self,
        upstream: Upstream,
        method: str,
        path_and_query: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
    ) -> Reply:
        pool = self._pools.get(upstream.name)
        if pool is not None:
            try:
                got = await pool.request(method, path_and_query, headers, body)
            except h1.RequestFailed as exc:
                return Reply(None, transport=exc.transport, error=exc.line)
            out = tuple((k, v) for k, v in got.headers if k.lower() not in HOP_BY_HOP)
            if got.error is not None:
                return Reply(got.status, out, b"", error=got.error, cut_short=True)
            return Reply(got.status, out, got.body)
        client = self._clients[upstream.name]
        request = client.build_request(method, path_and_query, headers=list(headers), content=body)
        try:
            response = await client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            # DNS failure, refused, connect timeout, TLS handshake failure: nothing was sent.
            return Reply(None, transport=Transport.NOT_SENT, error=_line(exc))
        except httpx.UnsupportedProtocol as exc:
            return Reply(None, transport=Transport.NOT_SENT, error=_line(exc))
        except (httpx.TransportError, OSError) as exc:
            # Written (or partly written), then a timeout, reset or EOF before a status line.
            return Reply(None, transport=Transport.SENT_NO_STATUS, error=_line(exc))
        out_headers = tuple(
            (k, v) for k, v in response.headers.multi_items() if k.lower() not in HOP_BY_HOP
        )
        try:
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_raw():
                size += len(chunk)
                if size > MAX_RESPONSE:
                    raise httpx.ReadError("response larger than the proxy keeps in memory")
                chunks.append(chunk)
            body = b"".join(chunks)
            return Reply(response.status_code, out_headers, body)
        except (httpx.TransportError, OSError) as exc:
            # The status line arrived: the outcome is known by status even if the body is cut.
            return Reply(response.status_code, out_headers, b"", error=_line(exc), cut_short=True)
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        for pool in self._pools.values():
            await pool.aclose()
        for client in self._clients.values():
            await client.aclose()


def decoded_headers(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    return list(headers.items())


def _line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or "no detail"
    return f"{type(exc).__name__}: {text}"[:300]
