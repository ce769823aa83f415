"""The MCP part of an upstream: which tool is which action (``tools:``), parsed once.

``profile: mcp`` upstreams name their tools; ``profile: stripe-mcp`` starts from the map of
Stripe's MCP server below (``STRIPE_TOOLS``), so the same ``stripe.*`` actions, argument names
and effect keys cover a refund made through REST and one made through MCP. A tool entry is::

    create_refund: read                      # a read: passes untouched, no receipt
    send_invoice:                            # a write: an action, decided and recorded
      action: billing.send_invoice
      arguments: {invoice_id: id}            # renamed (action argument: tool argument), or
                                             # a list of names picked as they are; omitted:
                                             # every argument as given
      effect: "send:{invoice_id}"            # optional: instead of the policy's effect:

A call that gives an argument the entry does not name is refused: the remote would act on a
value the policy never saw. Tools not listed follow ``unmapped_tools`` (deny by default).

Every other MCP method passes undecided, as a read. Where a server's resources or prompts act
(a ``resources/read`` that sends, a ``prompts/get`` that books), ``refuse_methods:`` lists the
methods the sidecar refuses instead, with a receipt::

    refuse_methods: [resources/read, prompts/get]
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ctrlrun.templates import Template, TemplateSyntaxError, parse_template
from ctrlrun.yamlstrict import Where, YamlList, YamlMap, check_keys, expect_map, expect_str, show

from .mcp_messages import CLIENT_METHODS

MCP_PROFILES = ("mcp", "stripe-mcp")
STRIPE_API = "https://api.stripe.com"
TOOL_KEYS = ("action", "arguments", "effect")
# What refuse_methods: may name: the client's methods but the session's own and tools/call.
REFUSABLE = tuple(
    sorted(
        CLIENT_METHODS
        - {
            "initialize",
            "notifications/initialized",
            "ping",
            "tools/call",
            "notifications/cancelled",
        }
    )
)


@dataclass(frozen=True)
class McpTool:
    """One tool of an MCP upstream: a read (``action`` None) or a write mapped to an action."""

    name: str
    action: str | None = None
    # (action argument, tool argument); None: every argument of the call, under its own name
    arguments: tuple[tuple[str, str], ...] | None = None
    effect: Template | None = None
    # Names ctrlrun adds, from the first of its sources the call gives (Stripe's payment_id)
    aliases: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class McpSettings:
    """The tools of one MCP upstream and what happens to the others."""

    tools: Mapping[str, McpTool] = field(default_factory=dict)
    unmapped_tools: Literal["deny", "allow"] = "deny"
    api_url: str | None = None  # stripe-mcp: the REST API its reconciler asks
    refused_methods: frozenset[str] = frozenset()  # ``refuse_methods:``


def _write(name: str, action: str, *aliases: tuple[str, tuple[str, ...]]) -> McpTool:
    return McpTool(name, action, None, None, tuple(aliases))


_PAYMENT_ID = ("payment_id", ("payment_intent", "charge"))
# Stripe's MCP server (mcp.stripe.com, the tools stripe-agent-toolkit 0.7 lists), plus the
# money-moving tools of the REST routes under the names a server would give them.
STRIPE_TOOLS: Mapping[str, McpTool] = {
    tool.name: tool
    for tool in (
        # Exactly the arguments Stripe's tool takes: a charge (another name of the payment)
        # or any other field would be a refund the effect key does not name.
        McpTool(
            "create_refund",
            "stripe.refund",
            tuple((name, name) for name in ("payment_intent", "amount", "reason")),
            None,
            (_PAYMENT_ID,),
        ),
        _write("create_payout", "stripe.payout"),
        _write("create_charge", "stripe.charge"),
        _write("cancel_payment_intent", "stripe.cancel_payment_intent"),
        _write("delete_customer", "stripe.delete_customer"),
        _write("cancel_subscription", "stripe.cancel_subscription"),
        _write("update_subscription", "stripe.update_subscription"),
        _write("create_customer", "stripe.create_customer"),
        _write("create_product", "stripe.create_product"),
        _write("create_price", "stripe.create_price"),
        _write("create_payment_link", "stripe.create_payment_link"),
        _write("create_invoice", "stripe.create_invoice"),
        _write("create_invoice_item", "stripe.create_invoice_item"),
        _write("finalize_invoice", "stripe.finalize_invoice"),
        _write("create_coupon", "stripe.create_coupon"),
        _write("update_dispute", "stripe.update_dispute"),
        *(
            McpTool(name)
            for name in (
                "list_customers",
                "list_products",
                "list_prices",
                "list_invoices",
                "list_payment_intents",
                "list_refunds",
                "list_subscriptions",
                "list_coupons",
                "list_disputes",
                "retrieve_balance",
                "get_stripe_account_info",
                "search_stripe_documentation",
                "search_stripe_resources",
                "fetch_stripe_resources",
            )
        ),
    )
}


def parse_mcp(
    entry: YamlMap, where: Where, profile: str, actions: Collection[str], api_url: str | None
) -> McpSettings:
    """The ``tools:`` and ``unmapped_tools:`` keys of an MCP upstream."""
    tools: dict[str, McpTool] = dict(STRIPE_TOOLS) if profile == "stripe-mcp" else {}
    if "tools" in entry:
        at = where.key(entry, "tools")
        table = expect_map(entry["tools"], at)
        for name, value in table.items():
            if not isinstance(name, str) or not name:
                raise at.error(f"a tool name must be a non-empty string, got {show(name)}")
            tools[name] = parse_tool(name, value, at.key(table, name), actions)
    unmapped = entry.get("unmapped_tools", "deny")
    if unmapped not in ("deny", "allow"):
        raise where.key(entry, "unmapped_tools").error(
            f"must be deny or allow, got {show(unmapped)}"
        )
    refused = frozenset[str]()
    if "refuse_methods" in entry:
        refused = _methods(entry["refuse_methods"], where.key(entry, "refuse_methods"))
    return McpSettings(tools, "allow" if unmapped == "allow" else "deny", api_url, refused)


def _methods(value: Any, where: Where) -> frozenset[str]:
    """The methods of ``refuse_methods:``: MCP client methods, but the session's own and
    ``tools/call`` (which ``tools:`` decides)."""
    if not isinstance(value, YamlList):
        raise where.error(f"must be a list of MCP methods, got {show(value)}")
    names = [expect_str(item, where.index(value, i)) for i, item in enumerate(value)]
    for i, name in enumerate(names):
        if name not in REFUSABLE:
            raise where.index(value, i).error(
                f"{name!r} is not a method refuse_methods can name (one of {', '.join(REFUSABLE)})"
            )
    return frozenset(names)


def parse_tool(name: str, value: Any, where: Where, actions: Collection[str]) -> McpTool:
    if value == "read":
        return McpTool(name)
    if not isinstance(value, YamlMap):
        raise where.error(f"must be 'read' or a mapping with action:, got {show(value)}")
    check_keys(value, where, TOOL_KEYS, required=("action",))
    action = expect_str(value["action"], where.key(value, "action"))
    if action not in actions:
        raise where.key(value, "action").error(f"action {action!r} is not declared under actions:")
    arguments = None
    if "arguments" in value:
        arguments = _arguments(value["arguments"], where.key(value, "arguments"))
    effect = None
    if "effect" in value:
        try:
            effect = parse_template(value["effect"])
        except TemplateSyntaxError as exc:
            raise where.key(value, "effect").error(str(exc)) from None
    return McpTool(name, action, arguments, effect)


def _arguments(value: Any, where: Where) -> tuple[tuple[str, str], ...]:
    if isinstance(value, YamlList):
        pairs = [(expect_str(item, where.index(value, i)),) * 2 for i, item in enumerate(value)]
    elif isinstance(value, YamlMap):
        pairs = [
            (expect_str(k, where), expect_str(v, where.key(value, k))) for k, v in value.items()
        ]
    else:
        raise where.error(f"must be a list of names or a mapping of renames, got {show(value)}")
    for pair in pairs:
        if pairs.count(pair) > 1:  # a mapping's keys are unique; a list's names need not be
            raise where.error(f"tool argument {pair[1]!r} is named twice")
    return tuple((a, b) for a, b in pairs)
