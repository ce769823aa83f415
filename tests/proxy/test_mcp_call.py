"""A forwarded tool call's record, pure: what the server's answer proves."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ctrlrun.proxy.classify import Transport
from ctrlrun.proxy.forward import Forwarded
from ctrlrun.proxy.mcp_call import classify_call, near_miss
from ctrlrun.proxy.mcp_config import STRIPE_TOOLS
from ctrlrun.proxy.mcp_messages import tool_call

CALL = tool_call({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "t"}})
JSON = (("Content-Type", "application/json"),)
SSE = (("Content-Type", "text/event-stream"),)


def answer(message: dict[str, Any], headers: tuple[tuple[str, str], ...] = JSON) -> Forwarded:
    body = json.dumps(message).encode()
    if headers == SSE:
        body = b"event: message\ndata: " + body + b"\n\n"
    return Forwarded(200, headers, body)


@pytest.mark.parametrize(
    ("reply", "outcome"),
    [
        (answer({"jsonrpc": "2.0", "id": 4, "result": {"content": []}}), "committed"),
        (answer({"jsonrpc": "2.0", "id": 4, "result": {"content": []}}, SSE), "committed"),
        (answer({"jsonrpc": "2.0", "id": 4, "result": {"isError": True}}), "ambiguous"),
        (answer({"jsonrpc": "2.0", "id": "4", "result": {}}), "ambiguous"),  # another id
        (answer({"jsonrpc": "2.0", "id": 4, "error": {"code": -32602}}), "failed"),
        (answer({"jsonrpc": "2.0", "id": 4, "error": {"code": -32603}}), "ambiguous"),
        (Forwarded(200, SSE, b'data: {"jsonrpc":"2.0","id":4,"result":{}}'), "ambiguous"),
        (Forwarded(200, JSON, b"", cut_short=True), "ambiguous"),
        (Forwarded(202, (), b""), "ambiguous"),
        (Forwarded(500, JSON, b"{}"), "ambiguous"),
        (Forwarded(404, JSON, b"{}"), "failed"),  # an unknown session: nothing ran
        (Forwarded(None, transport=Transport.NOT_SENT), "failed"),
        (Forwarded(None, transport=Transport.SENT_NO_STATUS), "ambiguous"),
    ],
)
def test_what_an_answer_proves(reply: Forwarded, outcome: str) -> None:
    assert classify_call(reply, CALL)[0] == outcome


@pytest.mark.parametrize(
    "name", ["Create_Refund", "create-refund", "create_refund ", "createRefund"]
)
def test_names_spelt_like_a_mapped_tool(name: str) -> None:
    assert near_miss(name, STRIPE_TOOLS) == "create_refund"


def test_other_names_are_no_near_miss() -> None:
    assert near_miss("create_refund", STRIPE_TOOLS) is None
    assert near_miss("delete_everything", STRIPE_TOOLS) is None
