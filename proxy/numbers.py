"""Arguments a policy compares as numbers must be numbers the proxy can read.

The kernel's rule for ``amount_gt: 1000`` and the like: an argument that is not an integer
makes the condition false (the reference semantics). In-process, arguments are Python values
and that is a programming error. Through the sidecar they come off the wire, and forms, queries
and paths carry only text: ``amount=5000`` is the string ``"5000"``, so a policy written as
"deny above 1000, otherwise allow" would let it through, and the server would read 5000. So,
for every argument a rule of the action compares with ``lt``/``lte``/``gt``/``gte``:

- an integer is taken as it is;
- text that spells an integer plainly (``-?(0|[1-9][0-9]*)``, as a form or query gives it) is
  read as that integer, since that is what a server that takes text for a number reads;
- anything else (missing, a list, ``true``, ``05000``, ``+5e3``, ``5000.0``, a JSON string with
  spaces) is refused ``invalid_request``: the policy cannot decide it, and ctrlrun does not
  guess what the remote would read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ctrlrun.conditions import NUMERIC_OPS
from ctrlrun.policy import Policy

from .refusals import Refusal
from .route_values import BadInput, shown

_PLAIN_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]{0,30})")


def compared(policy: Policy, action: str) -> frozenset[str]:
    """The arguments the rules of ``action`` compare as numbers."""
    entry = policy.actions.get(action)
    if entry is None:
        return frozenset()
    return frozenset(
        c.subject for rule in entry.rules for c in rule.conditions if c.op in NUMERIC_OPS
    )


def as_numbers(
    policy: Policy, action: str, arguments: Mapping[str, Any]
) -> dict[str, Any] | Refusal:
    """``arguments`` with the compared ones read as integers, or why they cannot be."""
    names = compared(policy, action)
    if not names:
        return dict(arguments)
    read = dict(arguments)
    for name in sorted(names):
        value = arguments.get(name)
        if type(value) is int:
            continue
        if isinstance(value, str) and _PLAIN_INTEGER.fullmatch(value):
            read[name] = int(value)
            continue
        given = "is missing" if name not in arguments else f"is {_shown(value)}"
        return Refusal(
            "invalid_request",
            "number_required",
            f"{name} {given}, and the policy decides {action} by comparing {name} as a "
            f"number: give {name} as an integer",
            action=action,
        )
    return read


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# JavaScript reads every JSON number as a double, as do Go's interface{} and many parsers
# (the TypeScript MCP SDK's servers among them): past 2**53, 9007199254740993 is
# 9007199254740992 there, one effect under two keys here.
_MAX_EXACT = 2**53 - 1


def check_doubles(value: Any, where: str) -> None:
    """Refuse an integer in ``value`` that a server reading numbers as doubles reads otherwise."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif type(item) is int and abs(item) > _MAX_EXACT:
            raise BadInput(
                f"{where} holds the integer {shown(str(item), 40)}, which JavaScript "
                "and other servers reading numbers as doubles read as another; send it as a string"
            )
