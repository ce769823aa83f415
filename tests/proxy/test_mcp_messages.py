"""MCP message reading, pure: strict bodies, tool calls, JSON and SSE answers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ctrlrun.proxy.mcp_messages import (
    ProtocolError,
    is_tool_call,
    load_messages,
    read_answer,
    response_for,
    same_id,
    sse_data,
    tool_call,
)

CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t"}}


@pytest.mark.parametrize(
    ("body", "headers", "code"),
    [
        (b'{"id":1,"method":"tools/list","method":"tools/call"}', {}, -32700),  # duplicate key
        (b'{"id":1,"params":{"arguments":{"a":1,"a":2}}}', {}, -32700),  # nested duplicate
        (b'{"id":NaN}', {}, -32700),
        (b"\xff\xfe{\x00}\x00", {}, -32700),  # UTF-16: the server may read it, ctrlrun does not
        (json.dumps(CALL).encode(), {"content-encoding": "gzip"}, -32700),
        (b"[]", {}, -32600),
        (b"[1]", {}, -32600),
        (b'"tools/call"', {}, -32600),
        (b"{", {}, -32700),
    ],
)
def test_bodies_ctrlrun_cannot_read_with_certainty_are_refused(
    body: bytes, headers: dict[str, str], code: int
) -> None:
    with pytest.raises(ProtocolError) as info:
        load_messages(body, headers)
    assert info.value.code == code


def test_a_message_and_a_batch() -> None:
    assert load_messages(json.dumps(CALL).encode(), {}) == CALL
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert load_messages(json.dumps([CALL, note]).encode(), {}) == [CALL, note]


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ({"method": "tools/call", "params": {"name": "t"}}, -32600),  # a notification
        ({"id": True, "method": "tools/call", "params": {"name": "t"}}, -32600),
        ({"id": 1.5, "method": "tools/call", "params": {"name": "t"}}, -32600),
        ({"id": 1, "method": "tools/call"}, -32602),
        ({"id": 1, "method": "tools/call", "params": {"name": 3}}, -32602),
        ({"id": 1, "method": "tools/call", "params": {"name": "t", "arguments": [1]}}, -32602),
    ],
)
def test_malformed_tool_calls(message: dict[str, Any], code: int) -> None:
    assert is_tool_call(message)
    with pytest.raises(ProtocolError) as info:
        tool_call(message)
    assert info.value.code == code


def test_only_tools_call_is_a_tool_call() -> None:
    assert not is_tool_call({"method": "tools/Call"})
    assert not is_tool_call({"method": "tools/list"})
    call = tool_call({**CALL, "params": {"name": "t", "arguments": {"a": 1}}})
    assert (call.request_id, call.name, dict(call.arguments)) == (1, "t", {"a": 1})


def test_ids_match_by_value_and_type() -> None:
    assert same_id(1, 1) and same_id("a", "a")
    assert not same_id(1, "1") and not same_id(True, 1) and not same_id(None, None)


def test_sse_answers_and_a_cut_last_event() -> None:
    body = (
        b'event: message\r\ndata: {"jsonrpc":"2.0","method":"notifications/message"}\r\n\r\n'
        b'data: {"jsonrpc":"2.0",\ndata: "id":1,"result":{}}\n\n'
        b": a comment\n\n"
        b'data: {"jsonrpc":"2.0","id":2,"result":{}}'  # no blank line: it never finished
    )
    assert len(list(sse_data(body))) == 2
    messages = read_answer((("Content-Type", "text/event-stream"),), body)
    assert messages is not None
    assert response_for(messages, 1) == {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert response_for(messages, 2) is None


def test_json_answers() -> None:
    ok = read_answer((("content-type", "application/json; charset=utf-8"),), b'[{"id":1}]')
    assert ok == [{"id": 1}]
    assert read_answer((("content-type", "text/html"),), b"<html>") is None
    assert read_answer((("content-type", "application/json"),), b"{cut") is None


def test_us_ascii_is_utf_8_only_for_a_body_that_is_ascii() -> None:
    from ctrlrun.proxy.route_values import body_charset

    declared = {"content-type": "application/json; charset=us-ascii"}
    assert body_charset(declared, b'{"a":"cafe"}') is None
    assert body_charset(declared, '{"a":"café"}'.encode()) == "us-ascii"
    utf8 = {"content-type": "application/json; charset=utf-8"}
    assert body_charset(utf8, '{"a":"café"}'.encode()) is None
