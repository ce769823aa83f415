"""The JSON-RPC ids of an MCP session's requests in flight, compared as servers compare them.

The ``mcp`` SDK's Streamable HTTP transport keeps one answer stream per request id (its
``str``) and sends each answer to the newest request holding that id, so a request ctrlrun
passed through answers a tool call that reuses its id while it is in flight::

    completion/complete id 5 (passed) ──► server: stream["5"] = the completion's POST
    tools/call          id 5          ──► server: stream["5"] = the call's POST
    the completion is answered -32602 ──► the call's POST: ctrlrun records the call failed
    the tool runs; the same call, made again, runs again

So a request of a session is refused while another with its id is in flight, whichever of
them is the tool call. Ids are compared loosely: 5 and "5" alike (the ``mcp`` SDK), 5.0 as 5
(JavaScript's numbers), 5.5 as 5 (Go's jsonrpc2 truncates a float id). A request whose answer
never came back whole (the agent hung up, the server cut it) may still be answered later, to
whichever request then holds its id: its id stays held for the session. That table is
bounded (``LIMIT``, least recent forgotten).

Requests naming no session are not held: without a session the ``mcp`` SDK serves each
request on a transport of its own (stateless mode, or an ``initialize``), and the TypeScript
SDK refuses to reuse a stateless one, so two agents' stateless calls with id 1 share nothing.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .mcp_sessions import HEADER

LIMIT = 10_000  # ids of requests cut short, per proxy
Key = tuple[str, str, str]  # (upstream, session, id as compared)


def id_key(value: Any) -> str | None:
    """The id as a server may compare it, or None when the message is no request to route."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:
            return str(value)
        return str(int(number)) if math.isfinite(number) else None
    return None


def request_keys(
    upstream: str, headers: Mapping[str, str], items: Sequence[Mapping[str, Any]]
) -> list[Key | None]:
    """The key of each message a session's server routes answers by; None for the others
    (notifications, responses, and every message of no session)."""
    session = headers.get(HEADER, "")
    keys: list[Key | None] = []
    for message in items:
        rid = id_key(message.get("id")) if "method" in message else None
        keys.append((upstream, session, rid) if session and rid is not None else None)
    return keys


class InFlight:
    """The keys of requests in flight, and of requests cut short, of every MCP session."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._held: set[Key] = set()
        self._lost: OrderedDict[Key, None] = OrderedDict()

    def busy(self, keys: Iterable[Key | None]) -> Key | None:
        """The first of ``keys`` another request holds, or None."""
        return next((k for k in keys if k is not None and self.holds(k)), None)

    def holds(self, key: Key) -> bool:
        return key in self._held or key in self._lost

    def hold(self, keys: Iterable[Key | None]) -> frozenset[Key]:
        held = frozenset(k for k in keys if k is not None)
        self._held |= held
        return held

    def release(self, keys: Iterable[Key]) -> None:
        """The requests were answered whole: their ids are free again."""
        self._held.difference_update(keys)

    def lose(self, keys: Iterable[Key]) -> None:
        """The requests ended without their answer: a later one may still route by them."""
        for key in keys:
            self._held.discard(key)
            self._lost[key] = None
            self._lost.move_to_end(key)
        while len(self._lost) > self.limit:
            self._lost.popitem(last=False)
