"""Where each MCP session lives: the session ids MCP servers assigned, by upstream and path.

A Streamable HTTP server names the session it opens in the ``Mcp-Session-Id`` header of its
answer to ``initialize`` (and may repeat it on later answers); the client ends the session
with a body-less DELETE to that same endpoint naming that id. The endpoint's path is not
configured, so a DELETE is a session's end only when it names an id this proxy saw the
server assign, on a 2xx answer to a POST, on that very path of that upstream. Any other
DELETE, on any path of the host, could be another API's write, and is refused.

The table is in memory and bounded: past ``LIMIT`` sessions the least recently seen is
forgotten, as are all of them when the proxy restarts. A forgotten session's DELETE is then
refused (fail closed), which MCP clients take as a session they could not end.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from .route_values import Request

LIMIT = 10_000  # sessions per proxy
HEADER = "mcp-session-id"


class Sessions:
    """The sessions MCP servers assigned, as (upstream, path, id); least recently seen first."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def assigned(self, upstream: str, path: str, session: str) -> None:
        key = (upstream, path, session)
        self._seen[key] = None
        self._seen.move_to_end(key)
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)

    def known(self, upstream: str, path: str, session: str) -> bool:
        key = (upstream, path, session)
        if key not in self._seen:
            return False
        self._seen.move_to_end(key)
        return True

    def ended(self, upstream: str, path: str, session: str) -> None:
        self._seen.pop((upstream, path, session), None)

    def answered(
        self,
        upstream: str,
        method: str,
        path: str,
        status: int | None,
        *,
        asked: str | None,
        given: str | None,
    ) -> None:
        """What an MCP upstream's answer teaches: a 2xx answer to a POST that names a session
        (``given``) assigns it on ``path``; a 2xx answer to a DELETE ends the session the
        DELETE named (``asked``). Nothing else does: a DELETE's or a GET's answer assigns no
        session, and a refused or failed request ends none."""
        if status is None or not 200 <= status <= 299:
            return
        if method == "POST" and given:
            self.assigned(upstream, path, given)
        elif method == "DELETE" and asked is not None:
            self.ended(upstream, path, asked)

    def refusal(self, upstream: str, request: Request) -> str | None:
        """Why the DELETE ``request`` to ``upstream`` is no end of a session the server
        assigned on its path, or None when it is (the id compared exactly, case and all)."""
        if request.body:
            return "ctrlrun relays no DELETE with a body"
        if HEADER in request.repeated:
            return "a DELETE that names two Mcp-Session-Ids"
        session = request.headers.get(HEADER)
        if session is None:
            return "a DELETE that names no Mcp-Session-Id"
        if not self.known(upstream, request.path, session):
            return (
                "a DELETE for a session this proxy did not see the server assign on "
                f"{request.path[:200]}"
            )
        return None


def header(headers: Sequence[tuple[str, str]], name: str) -> str | None:
    """A header's value as HTTP clients read it (repeated values joined), or None."""
    values = [v for k, v in headers if k.lower() == name]
    return ", ".join(values) if values else None
