"""The mitmproxy addon: recognise requests to configured upstreams and guard their writes.

The hook only gathers facts and applies the guard's answer. mitmproxy forwards a request
whose hook raised, so every error here is caught and refused: the protected path fails closed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from mitmproxy import http

from .answers import answer
from .config import Upstream
from .guard import Guard
from .principal import Principals
from .route_values import READ_METHODS
from .routes import Request

log = logging.getLogger("ctrlrun.proxy")
AUTH_KEY = "ctrlrun_principal"


class CtrlrunAddon:
    """Routes flows to the guard; everything that is not a configured upstream passes by."""

    def __init__(
        self,
        guard: Guard,
        upstreams: Sequence[Upstream],
        principals: Principals,
        reverse_specs: dict[str, str],
    ) -> None:
        self.guard = guard
        self.principals = principals
        self.by_address = {(u.scheme, u.host.lower(), u.port): u for u in upstreams}
        self.by_name = {u.name: u for u in upstreams}
        self.reverse_specs = reverse_specs  # mode spec -> upstream name
        self.auth: dict[str, str | None] = {}  # client connection id -> Proxy-Authorization

    def http_connect(self, flow: http.HTTPFlow) -> None:
        # Through HTTPS_PROXY the credential is on the CONNECT, not on the requests inside it.
        value = flow.request.headers.get("proxy-authorization")
        if value:
            self.auth[flow.client_conn.id] = value

    def client_disconnected(self, client: object) -> None:
        self.auth.pop(getattr(client, "id", ""), None)

    def upstream_for(self, flow: http.HTTPFlow) -> Upstream | None:
        spec = getattr(flow.client_conn.proxy_mode, "full_spec", "")
        if spec in self.reverse_specs:
            return self.by_name[self.reverse_specs[spec]]
        req = flow.request
        return self.by_address.get((req.scheme, req.host.lower(), req.port))

    async def request(self, flow: http.HTTPFlow) -> None:
        upstream = None
        try:
            upstream = self.upstream_for(flow)
            if upstream is None or flow.request.method.upper() in READ_METHODS:
                return  # not ours, or a read: reads always pass through
            req = flow.request
            raw = req.raw_content if req.raw_content is not None else b""
            headers = list(req.headers.items(multi=True))
            auth = req.headers.get("proxy-authorization") or self.auth.get(flow.client_conn.id)
            facts = Request(
                method=req.method.upper(),
                path=req.path.split("?", 1)[0],
                query={k: req.query.get_all(k) for k in req.query},
                headers={k.lower(): v for k, v in headers},
                body=raw,
            )
            result = await self.guard.handle(
                upstream,
                facts,
                target=req.path,
                headers=headers,
                principal=self.principals.resolve(auth),
            )
            if result is None:
                return
            flow.response = to_response(result.status or 502, result.headers, result.body)
        except Exception as exc:  # fail closed: mitmproxy would forward on an exception
            log.exception(
                "internal error on %s %s: refused", flow.request.method, flow.request.path
            )
            profile = upstream.profile if upstream else "http"
            a = answer(
                profile,
                "unavailable",
                reason="internal_error",
                message=f"internal error ({type(exc).__name__})",
                action=None,
                effect_key=None,
                receipt_id=None,
            )
            flow.response = to_response(a.status, a.headers, a.body)


def to_response(status: int, headers: Sequence[tuple[str, str]], body: bytes) -> http.Response:
    """A response carrying ``body`` as is (already encoded as its headers say)."""
    response = http.Response.make(status, b"")
    response.headers = http.Headers(
        [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in headers
            if k.lower() != "content-length"
        ]
    )
    response.raw_content = body
    response.headers["content-length"] = str(len(body))
    return response
