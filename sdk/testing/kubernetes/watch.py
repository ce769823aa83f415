"""Watches: a stream of events, made by polling the cluster and comparing snapshots."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping

from .objects import Obj

WATCH_POLL_SECONDS = 0.05
MAX_WATCH_SECONDS = 600
# The cluster's resourceVersion and the watched objects by uid, read under the lock.
Snapshot = Callable[[], tuple[int, dict[str, Obj]]]


async def watch_events(
    kind: str, query: Mapping[str, str], snapshot: Snapshot
) -> AsyncIterator[bytes]:
    """The events of one watch (``ADDED``, ``MODIFIED``, ``DELETED``), until its timeout."""
    rv_text = query.get("resourceVersion", "")
    since = int(rv_text) if rv_text.isdigit() and rv_text != "0" else None
    rv, seen = snapshot()
    for obj in seen.values():
        if since is None or int(_rv(obj)) > since:
            yield _event("ADDED" if since is None else "MODIFIED", obj)
    if query.get("sendInitialEvents") == "true":
        end = {"k8s.io/initial-events-end": "true"}
        marker = {"resourceVersion": str(rv), "annotations": end}
        yield _event("BOOKMARK", {"kind": kind, "metadata": marker})
    timeout = min(int(query.get("timeoutSeconds") or 60), MAX_WATCH_SECONDS)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        await asyncio.sleep(WATCH_POLL_SECONDS)
        rv, current = snapshot()
        for event in _changes(seen, current, rv):
            yield event
        seen = current


def _changes(seen: dict[str, Obj], current: dict[str, Obj], rv: int) -> list[bytes]:
    events = []
    for key, obj in current.items():
        old = seen.get(key)
        if old is None or _rv(old) != _rv(obj):
            events.append(_event("ADDED" if old is None else "MODIFIED", obj))
    for key in seen.keys() - current.keys():
        gone = seen[key]
        gone["metadata"]["resourceVersion"] = str(rv)
        events.append(_event("DELETED", gone))
    return events


def _rv(obj: Obj) -> str:
    return str(obj["metadata"]["resourceVersion"])


def _event(kind: str, obj: Obj) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"
