"""What the MCP gate refuses before any message is decided or forwarded, pure."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast, get_args

import pytest
from mcp import types

from ctrlrun.proxy.config import Upstream
from ctrlrun.proxy.guard import Guard
from ctrlrun.proxy.mcp_config import McpSettings
from ctrlrun.proxy.mcp_gate import McpGate, McpHandled
from ctrlrun.proxy.mcp_messages import CLIENT_METHODS
from ctrlrun.proxy.route_values import PassThrough, Request

UP = Upstream("m", "mcp", "http://mcp.test", "http", "mcp.test", 80, mcp=McpSettings())
PING = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
JSON = {"content-type": "application/json"}


def handle(request: Request) -> McpHandled | PassThrough:
    # Nothing here reaches a tool call, so the gate never asks its guard.
    gate = McpGate(cast(Guard, object()))
    got = gate.handle(UP, request, target=request.path, headers=[], principal=None)
    return asyncio.run(got)


def refused(request: Request) -> str:
    got = handle(request)
    assert isinstance(got, McpHandled), got
    assert got.status == 400 and got.decisions[0]["outcome"] == "invalid_request"
    message: Any = json.loads(got.body)["error"]["message"]
    assert isinstance(message, str) and message.startswith("ctrlrun: ")
    return message


def post(body: bytes = PING, path: str = "/mcp", **kw: Any) -> Request:
    return Request("POST", path, headers=kw.pop("headers", JSON), body=body, **kw)


def test_a_plain_message_passes() -> None:
    assert isinstance(handle(post()), PassThrough)


@pytest.mark.parametrize("name", ["content-type", "content-encoding"])
def test_a_body_header_sent_twice_is_refused(name: str) -> None:
    message = refused(post(repeated=frozenset({name})))
    assert f"the header {name} is sent more than once" in message


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "method": "notifications/initialized", "amount": 900000},
        {"jsonrpc": "2.0", "id": 1, "method": "ping", "_method": "DELETE"},
        {"jsonrpc": "2.0", "id": 1, "result": {}, "name": "create_refund"},
        [{"jsonrpc": "2.0", "id": 1, "method": "ping", "payment_intent": "pi_1"}],
    ],
)
def test_a_member_json_rpc_does_not_have_is_refused(message: Any) -> None:
    assert "JSON-RPC has no member" in refused(post(json.dumps(message).encode()))


def _sdk_methods(*unions: Any) -> set[str]:
    root = [u.model_fields["root"].annotation for u in unions]
    return {get_args(m.model_fields["method"].annotation)[0] for r in root for m in get_args(r)}


def test_the_methods_passed_are_those_the_official_client_sends() -> None:
    assert _sdk_methods(types.ClientRequest, types.ClientNotification) == CLIENT_METHODS
    for method in sorted(CLIENT_METHODS - {"tools/call"}):
        note = {"jsonrpc": "2.0", "method": method}
        assert isinstance(handle(post(json.dumps(note).encode())), PassThrough), method


@pytest.mark.parametrize(
    "method",
    ["refunds.create", "tools/call ", "Tools/call", "notifications/x", "sampling/createMessage"],
)
def test_any_other_method_is_refused(method: str) -> None:
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {}}
    assert "is not a method MCP clients send" in refused(post(json.dumps(message).encode()))
    assert "is not a method" in refused(post(json.dumps([message]).encode()))
