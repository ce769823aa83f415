"""The JSON-RPC id a tool call is forwarded with: one of ctrlrun's own, never the agent's.

A server routes each answer by its request's id. The ``mcp`` SDK's Streamable HTTP transport
keeps one answer stream per id and sends an answer to the newest request holding it, and a
stateless server may serve every client on one transport, where two agents' requests with id
1 are one stream. A request ctrlrun passes through (a completion with id 5) would then answer
the tool call with id 5, and the call's record would be another request's answer::

    completion/complete id 5 (passed) ──► server: stream["5"] = the completion's POST
    tools/call          id 5          ──► server: stream["5"] = the call's POST
    the completion is answered -32602 ──► the call's POST: the call recorded failed
    the tool runs; the same call, made again, runs again

So each tool call ctrlrun forwards carries a fresh id of its own (``ctrlrun-`` and 128 random
bits), which no other request of any session holds, ever: a request of the agent in flight, or
cut short and answered late, cannot answer it, and no id is held or refused for it. The
agent's id is put back into the answer it gets. A message of the agent naming such an id (as
its id, or as the ``requestId`` a cancellation names) is refused: only ctrlrun speaks them.

A ``notifications/cancelled`` naming the agent's id of a tool call reaches no call on the
server: a tool call, once forwarded, runs to its answer, which is what its record says.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from .mcp_messages import RequestId, encode, same_id

PREFIX = "ctrlrun-"


def wire_id() -> str:
    return PREFIX + secrets.token_hex(16)


def reserved(items: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a message of the agent names one of ctrlrun's ids, or None."""
    for message in items:
        params = message.get("params")
        named = [message.get("id")]
        if isinstance(params, Mapping):
            named.append(params.get("requestId"))
        if any(isinstance(i, str) and i.lower().startswith(PREFIX) for i in named):
            return f"ids beginning {PREFIX!r} are ctrlrun's own"
    return None


def wired(message: Mapping[str, Any], wire: str) -> bytes:
    """The message as forwarded: the agent's, with ctrlrun's id in place of the agent's."""
    return encode({**message, "id": wire})


def swap(response: Mapping[str, Any], original: RequestId) -> dict[str, Any]:
    return {**response, "id": original}


def restore(
    headers: Sequence[tuple[str, str]], body: bytes, wire: str, original: RequestId
) -> bytes:
    """The server's answer with the agent's id back in the call's response (JSON or SSE);
    anything else of it as it came. An answer that cannot be read is returned as it is."""
    kind = next((v for k, v in headers if k.lower() == "content-type"), "")
    kind = kind.split(";", 1)[0].strip().lower()
    try:
        if kind == "application/json":
            value = json.loads(body)
            items = value if isinstance(value, list) else [value]
            out = [_swapped(m, wire, original) for m in items]
            return encode(out if isinstance(value, list) else out[0])
        if kind == "text/event-stream":
            return _restore_sse(body.decode("utf-8"), wire, original).encode("utf-8")
    except (ValueError, RecursionError):
        pass
    return body


def _swapped(message: Any, wire: str, original: RequestId) -> Any:
    is_response = isinstance(message, dict) and ("result" in message or "error" in message)
    if is_response and same_id(message.get("id"), wire):
        return swap(message, original)
    return message


def _restore_sse(text: str, wire: str, original: RequestId) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    blocks = text.split("\n\n")
    for n, block in enumerate(blocks[:-1]):  # the last one never finished: left as it came
        lines = block.split("\n")
        data = [line.partition(":")[2].removeprefix(" ") for line in lines if _is_data(line)]
        if not data:
            continue
        try:
            value = json.loads("\n".join(data))
        except ValueError:
            continue
        items = value if isinstance(value, list) else [value]
        out = [_swapped(m, wire, original) for m in items]
        if out == items:
            continue
        payload = (out if isinstance(value, list) else out[0]) if out else value
        first = next(i for i, line in enumerate(lines) if _is_data(line))
        kept = [line for line in lines if not _is_data(line)]
        kept.insert(first, "data: " + encode(payload).decode("ascii"))
        blocks[n] = "\n".join(kept)
    return "\n\n".join(blocks)


def _is_data(line: str) -> bool:
    return line.partition(":")[0] == "data"
