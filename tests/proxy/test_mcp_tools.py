"""Tool calls as actions, pure; and the ``tools:`` keys of MCP upstreams."""

from __future__ import annotations

from typing import Any

import pytest

from ctrlrun.errors import PolicyError
from ctrlrun.proxy.config_parse import policy_from_yaml, proxy_config
from ctrlrun.proxy.mcp_config import STRIPE_TOOLS, McpTool
from ctrlrun.proxy.mcp_tools import map_call
from ctrlrun.proxy.route_values import BadInput

REFUND = STRIPE_TOOLS["create_refund"]
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  billing.send: {decision: allow}
upstreams:
"""


def test_stripe_refund_is_the_rest_action_with_payment_id() -> None:
    mapped = map_call(REFUND, {"payment_intent": "pi_1", "amount": 500})
    assert mapped.action == "stripe.refund"
    assert mapped.arguments == {"payment_intent": "pi_1", "amount": 500, "payment_id": "pi_1"}
    assert "payment_id" in map_call(REFUND, {"payment_intent": "pi_1"}).arguments


@pytest.mark.parametrize(
    "arguments",
    [
        {"payment_intent": "pi_1", "payment_id": "pi_2"},  # ctrlrun derives it
        {"payment_intent": "pi_1", "amount": "500"},
        {"payment_intent": "pi_1", "amount": -1},
        {"payment_intent": "pi_1", "amount": True},
        {"payment_intent": "pi_1\r\nX: y"},
        {"payment_intent": "pi_1", "charge": "ch_1"},  # another name of the payment
        {"payment_intent": "pi_1", "metadata": {"a": "b"}},  # not an argument of Stripe's tool
    ],
)
def test_refused_refund_arguments(arguments: dict[str, Any]) -> None:
    with pytest.raises(BadInput):
        map_call(REFUND, arguments)


def test_derived_arguments_cannot_be_given() -> None:
    mapped = map_call(REFUND, {"payment_intent": "pi_1"}, {"account": "acct_1"})
    assert mapped.arguments["account"] == "acct_1"
    anything = McpTool("t", "a.b")
    with pytest.raises(BadInput, match="derives"):
        map_call(anything, {"account": "self"}, {"account": "acct_1"})


def test_renamed_and_picked_arguments_refuse_any_other() -> None:
    tool = McpTool("send", "billing.send", (("invoice_id", "id"),))
    assert map_call(tool, {"id": "in_1"}).arguments == {"invoice_id": "in_1"}
    with pytest.raises(BadInput, match="does not name"):
        map_call(tool, {"id": "in_1", "also": "x"})


def test_tools_table_parses() -> None:
    text = POLICY + (
        "  b:\n    profile: mcp\n    url: http://127.0.0.1:9\n    unmapped_tools: allow\n"
        "    tools:\n      list: read\n      send:\n        action: billing.send\n"
        "        arguments: {invoice_id: id}\n        effect: 'send:{invoice_id}'\n"
    )
    (up,) = proxy_config(policy_from_yaml(text)).upstreams
    assert up.mcp is not None and up.mcp.unmapped_tools == "allow"
    assert up.mcp.tools["list"].action is None
    send = up.mcp.tools["send"]
    assert send.arguments == (("invoice_id", "id"),)
    assert send.effect is not None and send.effect.text == "send:{invoice_id}"


def test_stripe_mcp_has_the_built_in_map_and_asks_rest() -> None:
    text = POLICY + "  s: {profile: stripe-mcp, url: 'https://mcp.stripe.com'}\n"
    (up,) = proxy_config(policy_from_yaml(text)).upstreams
    assert up.mcp is not None and up.mcp.api_url == "https://api.stripe.com"
    assert up.mcp.tools["create_refund"].action == "stripe.refund"
    assert up.mcp.tools["list_refunds"].action is None
    assert up.mcp.unmapped_tools == "deny"


@pytest.mark.parametrize(
    ("entry", "where"),
    [
        ("{profile: mcp, url: 'http://a.test', tools: {x: write}}", "upstreams.m.tools.x"),
        ("{profile: mcp, url: 'http://a.test', tools: {x: {action: nope}}}", "tools.x.action"),
        ("{profile: mcp, url: 'http://a.test', unmapped_tools: maybe}", "unmapped_tools"),
        ("{profile: mcp, url: 'http://a.test', api_url: 'http://b.test'}", "api_url"),
        ("{profile: stripe, url: 'http://a.test', tools: {}}", "tools"),
    ],
)
def test_bad_mcp_keys_name_their_place(entry: str, where: str) -> None:
    with pytest.raises(PolicyError, match=where.replace(".", r"\.")):
        policy_from_yaml(POLICY + f"  m: {entry}\n")
