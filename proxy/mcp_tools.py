"""A tool call as an action, pure: the tool's entry turns its arguments into the action's.

Arguments are checked as the REST routes check theirs: money is a non-negative integer of
minor units (``amount``, ``*_amount``), names ctrlrun derives may not be given, and text that
could split a header or a log line is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .mcp_config import McpTool
from .numbers import check_doubles
from .route_values import BadInput, Mapped, check_arguments, shown


def map_call(
    tool: McpTool, arguments: Mapping[str, Any], derived: Mapping[str, Any] | None = None
) -> Mapped:
    """The action and arguments of a call of the write ``tool``; raise ``BadInput`` if unsure.

    ``derived``: arguments ctrlrun reads from the request itself (stripe-mcp's ``account``,
    from Stripe-Account), which the call may not give."""
    assert tool.action is not None
    _case_variants(tool, arguments)
    check_doubles(dict(arguments), f"the arguments of {shown(tool.name)}")
    if tool.arguments is None:
        out = dict(arguments)
    else:
        known = {source for _, source in tool.arguments}
        for name in arguments:
            if name not in known:
                raise BadInput(
                    f"tool {shown(tool.name)} was given argument {shown(name)}, which its "
                    "entry under tools: does not name"
                )
        out = {to: arguments[source] for to, source in tool.arguments if source in arguments}
    for alias, sources in tool.aliases:
        if alias in arguments:
            raise BadInput(f"{alias!r} is not an argument of {tool.name}; ctrlrun derives it")
        value = next((arguments[s] for s in sources if isinstance(arguments.get(s), str)), None)
        if value:
            out[alias] = value
    for name, value in (derived or {}).items():
        if name in arguments:
            raise BadInput(f"{name!r} is not an argument of {tool.name}; ctrlrun derives it")
        out[name] = value
    for name, value in out.items():
        money = name == "amount" or name.endswith("_amount")
        if money and (type(value) is not int or value < 0):
            raise BadInput(
                f"{name} must be a non-negative integer in minor units, got {shown(repr(value))}"
            )
    check_arguments(out)
    return Mapped(tool.action, out)


def _case_variants(tool: McpTool, arguments: Mapping[str, Any]) -> None:
    """Refuse "Amount" where ctrlrun reads "amount": a server matching keys without regard to
    case (Go's encoding/json) would take it as the amount ctrlrun never checked."""
    special = {source for _, sources in tool.aliases for source in sources}
    for name in arguments:
        folded = name.casefold()
        if name == folded:
            continue
        if folded == "amount" or folded.endswith("_amount") or folded in special:
            raise BadInput(
                f"tool {shown(tool.name)} was given argument {shown(name)}; ctrlrun reads "
                f"{shown(folded)} and a server may read this as it"
            )
