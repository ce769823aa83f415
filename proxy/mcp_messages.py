"""MCP's Streamable HTTP messages, pure: what a POST carries and what an answer says.

A POST body is one JSON-RPC message or a batch (a JSON array). ctrlrun reads it strictly
(UTF-8, no duplicate keys, no NaN, no content coding), because a body it reads one way and the
server another would let a tool call past unseen. An answer is ``application/json`` (one
message or an array) or ``text/event-stream`` (one message per ``data:`` event).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .route_values import body_charset

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# The server refused the message before running anything: nothing happened.
NOT_RUN_CODES = frozenset({PARSE_ERROR, INVALID_REQUEST, -32601, INVALID_PARAMS})
MAX_DEPTH = 64
# The members a server reads from a message and from a call's params. Some servers match
# JSON keys without regard to case (Go's encoding/json, which the Go MCP SDKs use: "Method"
# is "method" there), so a key that is one of these but for its case is refused.
ENVELOPE_KEYS = ("jsonrpc", "id", "method", "params", "result", "error")
PARAMS_KEYS = ("name", "arguments", "_meta")
# The requests and notifications an MCP client sends a server (the ``mcp`` SDK's
# ClientRequest and ClientNotification). Any other method on the host may be another
# JSON-RPC API's write, which ctrlrun would pass undecided as "no tools/call".
CLIENT_METHODS = frozenset(
    {
        "completion/complete",
        "initialize",
        "logging/setLevel",
        "notifications/cancelled",
        "notifications/initialized",
        "notifications/progress",
        "notifications/roots/list_changed",
        "notifications/tasks/status",
        "ping",
        "prompts/get",
        "prompts/list",
        "resources/list",
        "resources/read",
        "resources/subscribe",
        "resources/templates/list",
        "resources/unsubscribe",
        "tasks/cancel",
        "tasks/get",
        "tasks/list",
        "tasks/result",
        "tools/call",
        "tools/list",
    }
)

RequestId = str | int


class ProtocolError(Exception):
    """A message ctrlrun cannot read with certainty: answered with a JSON-RPC error."""

    def __init__(self, code: int, message: str, request_id: RequestId | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


@dataclass(frozen=True)
class ToolCall:
    """One ``tools/call`` request of a POST."""

    request_id: RequestId
    name: str
    arguments: Mapping[str, Any]
    message: Mapping[str, Any]


def load_messages(body: bytes, headers: Mapping[str, str]) -> list[Any] | dict[str, Any]:
    """The POST's message (a dict) or batch (a list); raise ``ProtocolError`` when unsure."""
    coding = headers.get("content-encoding", "").strip().lower()
    if coding not in ("", "identity"):
        raise ProtocolError(PARSE_ERROR, f"ctrlrun does not read {coding!r}-coded MCP bodies")
    charset = body_charset(headers, body)
    if charset is not None:
        raise ProtocolError(PARSE_ERROR, f"ctrlrun reads MCP bodies as UTF-8, not {charset[:40]!r}")
    try:
        text = body.decode("utf-8")
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ProtocolError(PARSE_ERROR, f"the body is not one JSON value: {exc}") from None
    if isinstance(value, dict):
        _check_message(value)
        return value
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        for message in value:
            _check_message(message)
        return value
    raise ProtocolError(INVALID_REQUEST, "the body must be a JSON-RPC message or a batch of them")


def _check_message(message: Mapping[str, Any]) -> None:
    """A JSON-RPC 2.0 request, notification or response: its members and no others, spelt
    exactly.

    Anything else is not MCP: another API on the same host (``POST /v1/refunds`` with a JSON
    body) would pass as "no tools/call" and reach the server undecided."""
    _exact_members(message, ENVELOPE_KEYS, "a message")
    extra = next((key for key in message if key not in ENVELOPE_KEYS), None)
    if extra is not None:
        # A REST API beside the endpoint reads its own fields from such a body (and Laravel
        # a "_method" as the method to run), ignoring "jsonrpc" and "method".
        raise ProtocolError(INVALID_REQUEST, f"JSON-RPC has no member {extra[:40]!r}")
    response = "id" in message and ("result" in message) != ("error" in message)
    method = message.get("method")
    if message.get("jsonrpc") != "2.0" or not (isinstance(method, str) or response):
        raise ProtocolError(
            INVALID_REQUEST,
            'not a JSON-RPC 2.0 message ("jsonrpc": "2.0" and a method or a result)',
        )
    if isinstance(method, str) and method not in CLIENT_METHODS:
        raise ProtocolError(INVALID_REQUEST, f"{method[:60]!r} is not a method MCP clients send")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    folded: set[str] = set()
    for key, value in pairs:
        if key.casefold() in folded:
            # Parsers disagree on which of two values wins, and some read "Amount" as
            # "amount": the server may read the other one.
            raise ValueError(f"key {key[:40]!r} is given twice (case aside)")
        folded.add(key.casefold())
        out[key] = value
    return out


def _exact_members(obj: Mapping[str, Any], names: Sequence[str], where: str) -> None:
    """Refuse a key that is one of ``names`` but for its case: ctrlrun would not read it, and
    a server matching keys loosely would."""
    for key in obj:
        for name in names:
            if key != name and key.casefold() == name:
                raise ProtocolError(
                    INVALID_REQUEST, f"{where} has the key {key[:40]!r}; JSON-RPC names it {name!r}"
                )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def is_tool_call(message: Mapping[str, Any]) -> bool:
    return message.get("method") == "tools/call"


def tool_call(message: Mapping[str, Any]) -> ToolCall:
    """The call in a ``tools/call`` message; raise ``ProtocolError`` when it is malformed."""
    rid = message.get("id")
    if not valid_id(rid):
        raise ProtocolError(INVALID_REQUEST, "a tools/call must carry a string or integer id")
    assert isinstance(rid, str | int)
    params = message.get("params")
    if not isinstance(params, dict):
        raise ProtocolError(INVALID_PARAMS, "tools/call params must be an object", rid)
    try:
        _exact_members(params, PARAMS_KEYS, "tools/call params")
    except ProtocolError as exc:
        raise ProtocolError(INVALID_PARAMS, exc.message, rid) from None
    name = params.get("name")
    if not isinstance(name, str) or not name:
        raise ProtocolError(INVALID_PARAMS, "tools/call params.name must be a string", rid)
    arguments = params.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ProtocolError(INVALID_PARAMS, "tools/call params.arguments must be an object", rid)
    return ToolCall(rid, name, arguments, message)


def valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def same_id(a: Any, b: Any) -> bool:
    """JSON-RPC ids match by value and type (1 is not "1"; true is not 1)."""
    return valid_id(a) and valid_id(b) and type(a) is type(b) and a == b


def read_answer(headers: Sequence[tuple[str, str]], body: bytes) -> list[dict[str, Any]] | None:
    """The JSON-RPC messages of a server's answer, or None when it cannot be read."""
    kind = next((v for k, v in headers if k.lower() == "content-type"), "")
    kind = kind.split(";", 1)[0].strip().lower()
    try:
        if kind == "text/event-stream":
            return [m for data in sse_data(body) for m in _as_list(json.loads(data))]
        if kind == "application/json":
            return _as_list(json.loads(body))
    except (ValueError, RecursionError):
        return None
    return None


def _as_list(value: Any) -> list[dict[str, Any]]:
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(m, dict) for m in items):
        raise ValueError("not JSON-RPC messages")
    return items


def sse_data(body: bytes) -> Iterator[str]:
    """The data of each complete ``message`` event of an SSE stream (a cut last one dropped)."""
    text = body.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    blocks = text.split("\n\n")
    for block in blocks[:-1]:  # the last block has no blank line after it: it never finished
        event, data = "message", []
        for line in block.split("\n"):
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
        if data and event == "message":
            yield "\n".join(data)


def response_for(messages: Sequence[Mapping[str, Any]], request_id: RequestId) -> Any:
    """The response (result or error) to ``request_id`` among ``messages``, or None."""
    for message in messages:
        if ("result" in message or "error" in message) and same_id(message.get("id"), request_id):
            return message
    return None


def rpc_error(request_id: RequestId | None, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def tool_error(request_id: RequestId, text: str, meta: Mapping[str, Any]) -> dict[str, Any]:
    """A tool result the model reads: ``isError`` and one text content (MCP's convention)."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "result": {
            "content": [{"type": "text", "text": text}],
            "isError": True,
            "_meta": {"com.ctrlrun/receipt": dict(meta)},
        },
    }


def encode(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=True, separators=(",", ":")).encode("ascii")
