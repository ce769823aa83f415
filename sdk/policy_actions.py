"""The ``actions:`` section of a policy: what each action may do, as frozen values.

``policy.py`` loads the file and hands this module the ``actions:`` mapping; every entry
becomes an ``ActionPolicy`` (a fixed ``decision`` or ordered ``rules``, its templates, its
window, how its approvals are used and how many operators must give them, its budget).
Every error is one ``where.error(...)`` line naming the file, line and key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any, Literal, cast

from .budgets import Budget, parse_budget
from .conditions import Condition, parse_conditions
from .templates import Template, TemplateSyntaxError, parse_template
from .yamlstrict import (
    Where,
    YamlList,
    YamlMap,
    check_keys,
    expect_choice,
    expect_map,
    expect_str,
    show,
)

SCHEMA_V1 = "ctrlrun.policy/v1"
SCHEMA_V2 = "ctrlrun.policy/v2"
ACTION_KEYS = {
    "decision": SCHEMA_V1,
    "rules": SCHEMA_V1,
    "effect": SCHEMA_V2,
    "resource": SCHEMA_V2,
    "window": SCHEMA_V2,
    "approval": SCHEMA_V2,
    "approvals_required": SCHEMA_V2,  # a quorum: that many different operators (approvals.py)
    "budget": SCHEMA_V2,  # budgets.py
}
# How a granted approval may be used: by the identical action re-sent ("resend", so a client
# that cannot add a header, such as kubectl, can finish it), or only when presented ("header").
APPROVAL_USES = ("resend", "header")
RULE_KEYS = ("when", "decision")
_DURATION = re.compile(r"([1-9][0-9]*)([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_APPROVALS = 20


class Decision(StrEnum):
    """What the policy says about an action."""

    ALLOW = "allow"
    APPROVE = "approve"
    DENY = "deny"


@dataclass(frozen=True)
class Evaluation:
    """A decision and why: ``decision``, ``rule[N]``, ``no_matching_rule``, ``unknown_action``.

    ``approvals``: how many different operators must approve, when approval is asked.
    """

    decision: Decision
    reason: str
    approvals: int = 1


@dataclass(frozen=True)
class Rule:
    """One entry of ``rules:``; no conditions means it always matches."""

    decision: Decision
    conditions: tuple[Condition, ...] = ()

    def matches(self, arguments: Mapping[str, Any]) -> bool:
        return all(condition.holds(arguments) for condition in self.conditions)


@dataclass(frozen=True)
class ActionPolicy:
    """One entry of ``actions:``: a fixed ``decision`` or ordered ``rules``, plus templates."""

    name: str
    decision: Decision | None = None
    rules: tuple[Rule, ...] = ()
    effect: Template | None = None
    resource: Template | None = None
    window: timedelta | None = None
    approval: Literal["resend", "header"] = "resend"
    budget: Budget | None = None
    approvals_required: int = 1

    def evaluate(self, arguments: Mapping[str, Any]) -> Evaluation:
        n = self.approvals_required
        if self.decision is not None:
            return Evaluation(self.decision, "decision", n)
        for index, rule in enumerate(self.rules):
            if rule.matches(arguments):
                return Evaluation(rule.decision, f"rule[{index}]", n)
        return Evaluation(Decision.DENY, "no_matching_rule", n)

    def may_ask(self) -> bool:
        """Whether any answer of this action asks a human (a decision, a rule, its budget)."""
        decisions = (
            [self.decision] if self.decision is not None else [r.decision for r in self.rules]
        )
        return Decision.APPROVE in decisions or self.asks_past_budget

    @property
    def asks_past_budget(self) -> bool:
        """Whether past its budget's limit the action asks a human (``over: approve``)."""
        return self.budget is not None and self.budget.over == "approve"


def check_versions(entry: YamlMap, where: Where, since: Mapping[str, str], schema: str) -> None:
    if schema != SCHEMA_V1:
        return
    for key in entry:
        if since[key] != SCHEMA_V1:
            raise where.key(entry, key).error(
                f"{key!r} needs schema: {since[key]} (this file declares {schema})"
            )


def parse_actions(value: Any, where: Where, schema: str) -> dict[str, ActionPolicy]:
    entries = expect_map(value, where)
    actions: dict[str, ActionPolicy] = {}
    for name, entry in entries.items():
        at = where.key(entries, name)
        if not isinstance(name, str) or not name:
            raise at.error(f"an action name must be a non-empty string, got {show(name)}")
        actions[name] = _action(name, entry, at, schema)
    return actions


def _action(name: str, value: Any, where: Where, schema: str) -> ActionPolicy:
    if not isinstance(value, YamlMap):
        raise where.error(f"must be a mapping with decision: or rules:, got {show(value)}")
    check_keys(value, where, ACTION_KEYS)
    check_versions(value, where, ACTION_KEYS, schema)
    if ("decision" in value) == ("rules" in value):
        raise where.error("needs exactly one of decision: or rules:")

    def at(key: str) -> Where:
        return where.key(value, key)

    decision = _decision(value["decision"], at("decision")) if "decision" in value else None
    rules = _rules(value["rules"], at("rules")) if "rules" in value else ()
    entry = ActionPolicy(
        name=name,
        decision=decision,
        rules=rules,
        effect=_template(value["effect"], at("effect")) if "effect" in value else None,
        resource=_template(value["resource"], at("resource")) if "resource" in value else None,
        window=parse_window(value["window"], at("window")) if "window" in value else None,
        approval=cast(
            Literal["resend", "header"],
            expect_choice(value.get("approval", "resend"), at("approval"), APPROVAL_USES),
        ),
        budget=parse_budget(value["budget"], at("budget"), parse_window)
        if "budget" in value
        else None,
    )
    if "approvals_required" not in value:
        return entry
    required = _approvals(value["approvals_required"], at("approvals_required"))
    if not entry.may_ask():
        raise at("approvals_required").error(
            "this action never asks for approval (no decision: approve, no rule that does, "
            "no budget with over: approve)"
        )
    return ActionPolicy(**{**entry.__dict__, "approvals_required": required})


def _approvals(value: Any, where: Where) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_APPROVALS:
        raise where.error(
            f"must be a whole number from 1 to {MAX_APPROVALS} (how many different operators "
            f"must approve), got {show(value)}"
        )
    return value


def _decision(value: Any, where: Where) -> Decision:
    return Decision(expect_choice(value, where, [d.value for d in Decision]))


def _rules(value: Any, where: Where) -> tuple[Rule, ...]:
    if not isinstance(value, YamlList):
        raise where.error(f"must be a list of rules, got {show(value)}")
    if not value:
        raise where.error("must not be empty: use decision: for a fixed answer")
    rules: list[Rule] = []
    for index, item in enumerate(value):
        at = where.index(value, index)
        rule = expect_map(item, at)
        check_keys(rule, at, RULE_KEYS, required=("decision",))
        conditions: tuple[Condition, ...] = ()
        if "when" in rule:
            conditions = parse_conditions(rule["when"], at.key(rule, "when"))
        rules.append(Rule(_decision(rule["decision"], at.key(rule, "decision")), conditions))
    return tuple(rules)


def _template(value: Any, where: Where) -> Template:
    try:
        return parse_template(expect_str(value, where))
    except TemplateSyntaxError as exc:
        raise where.error(str(exc)) from None


def parse_window(value: Any, where: Where) -> timedelta:
    """``30s``, ``10m``, ``1h``, ``2d`` or a positive integer number of seconds."""
    match = _DURATION.fullmatch(value) if isinstance(value, str) else None
    if match is not None:
        seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    elif isinstance(value, int) and not isinstance(value, bool) and value > 0:
        seconds = value
    else:
        raise where.error(
            "must be a duration such as '30s', '10m', '1h' or '2d', or a positive number "
            f"of seconds, got {show(value)}"
        )
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise where.error(f"{show(value)} is too long a window") from None
