"""The policy: what each action may do, parsed once from ``ctrlrun.yaml`` into frozen values.

A policy file looks like::

    schema: ctrlrun.policy/v2
    mode: enforce                     # or observe (v2)
    actions:
      stripe.refund:
        effect: "refund:{payment_id}"  # v2: the effect key template
        window: 10m                    # v2: a committed key may be reserved again after this
        rules:
          - when: {amount_lte: 5000}
            decision: allow
          - decision: approve
    upstreams: {...}                  # v2: the proxy's (parsed by ctrlrun.proxy.config_parse)
    agents: {...}                     # v2: the proxy's

Every load error is one ``PolicyError`` line: ``file:line: key.path: what is wrong``.
The loader parses ``schema``, ``actions`` and ``mode``; the other sections belong to the rooms
that pass their ``Section`` to ``from_file``/``from_yaml`` (see ``policy_sections.py``).
"""

from __future__ import annotations

import os
import re
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from .action import canonical_bytes, sha256
from .budgets import Budget, parse_budget
from .conditions import Condition, parse_conditions
from .config import policy_path
from .errors import PolicyError
from .operators import OPERATORS
from .policy_sections import Section, SectionContext
from .templates import Template, TemplateSyntaxError, parse_template
from .yamlstrict import (
    Where,
    YamlList,
    YamlMap,
    check_keys,
    check_plain,
    expect_choice,
    expect_map,
    expect_str,
    load,
    plain,
    show,
)

SCHEMA_V1 = "ctrlrun.policy/v1"
SCHEMA_V2 = "ctrlrun.policy/v2"
SCHEMAS = (SCHEMA_V1, SCHEMA_V2)
# The file format: every top-level key, and the first schema that has it. The loader parses
# schema, actions and mode itself, and the sections of KERNEL_SECTIONS; every other key belongs
# to a room that hands its Section to the loader (policy_sections.py). A new section is one
# line here plus its Section: in KERNEL_SECTIONS if the kernel reads it, else with its room.
TOP_KEYS = {
    "schema": SCHEMA_V1,
    "actions": SCHEMA_V1,
    "mode": SCHEMA_V2,
    "upstreams": SCHEMA_V2,  # the proxy's
    "agents": SCHEMA_V2,  # the proxy's
    "egress": SCHEMA_V2,  # the proxy's
    "limits": SCHEMA_V2,  # the proxy's
    "notify": SCHEMA_V2,  # the proxy's: webhooks (proxy/notify.py)
    "operators": SCHEMA_V2,  # the kernel's: who may approve, resolve, freeze (operators.py)
}
# Sections the kernel reads from every policy, whoever loads it.
KERNEL_SECTIONS: tuple[Section[Any], ...] = (OPERATORS,)
ACTION_KEYS = {
    "decision": SCHEMA_V1,
    "rules": SCHEMA_V1,
    "effect": SCHEMA_V2,
    "resource": SCHEMA_V2,
    "window": SCHEMA_V2,
    "approval": SCHEMA_V2,
    "budget": SCHEMA_V2,  # budgets.py
}
# How a granted approval may be used: by the identical action re-sent ("resend", so a client
# that cannot add a header, such as kubectl, can finish it), or only when presented ("header").
APPROVAL_USES = ("resend", "header")
_OWN_KEYS = frozenset({"schema", "actions", "mode"})
RULE_KEYS = ("when", "decision")
MODES = ("enforce", "observe")
_DURATION = re.compile(r"([1-9][0-9]*)([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

Mode = Literal["enforce", "observe"]
T = TypeVar("T")


class Decision(StrEnum):
    """What the policy says about an action."""

    ALLOW = "allow"
    APPROVE = "approve"
    DENY = "deny"


@dataclass(frozen=True)
class Evaluation:
    """A decision and why: ``decision``, ``rule[N]``, ``no_matching_rule``, ``unknown_action``."""

    decision: Decision
    reason: str


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

    def evaluate(self, arguments: Mapping[str, Any]) -> Evaluation:
        if self.decision is not None:
            return Evaluation(self.decision, "decision")
        for index, rule in enumerate(self.rules):
            if rule.matches(arguments):
                return Evaluation(rule.decision, f"rule[{index}]")
        return Evaluation(Decision.DENY, "no_matching_rule")


@dataclass(frozen=True, eq=False)
class Policy:
    """A loaded policy. Build one with ``from_file`` or ``from_yaml``."""

    actions: Mapping[str, ActionPolicy]
    mode: Mode
    schema: str
    policy_hash: str
    source: str
    path: Path | None = None
    # The parsed value of each section the loader was given, by name (see ``section``).
    sections: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        sections: Iterable[Section[Any]] = (),
    ) -> Policy:
        """Load the policy at ``path``, else ``$CTRLRUN_CONFIG``, else ``./ctrlrun.yaml``.

        A missing or unreadable file, a ``$CTRLRUN_CONFIG`` that is set but blank, and any
        invalid content raise ``PolicyError`` with one line naming the file (and line).
        ``sections`` are parsed too, and their values read back with ``section``.
        """
        how = ""
        if path is None:
            if os.environ.get("CTRLRUN_CONFIG") is not None:
                how = " (named by $CTRLRUN_CONFIG)"
            else:
                how = " (the default; pass a path or set $CTRLRUN_CONFIG)"
        source = os.fspath(policy_path(path))
        try:
            data = Path(source).read_bytes()
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
            raise PolicyError(f"policy file {source} could not be read{how}: {reason}") from None
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            raise PolicyError(f"{source}:{line}: not valid UTF-8 (byte {exc.start})") from None
        return cls._parse(text, source=source, path=Path(source).absolute(), sections=sections)

    @classmethod
    def from_yaml(
        cls, text: str, *, source: str = "<string>", sections: Iterable[Section[Any]] = ()
    ) -> Policy:
        """Parse a policy from YAML text; ``source`` names it in error messages."""
        if not isinstance(text, str):
            raise PolicyError(f"{source}: policy text must be a str, got {type(text).__name__}")
        return cls._parse(text, source=source, path=None, sections=sections)

    @classmethod
    def _parse(
        cls, text: str, *, source: str, path: Path | None, sections: Iterable[Section[Any]]
    ) -> Policy:
        doc = load(text, source=source)
        root = Where(source, "", getattr(doc, "line", 1))
        if doc is None:
            raise root.error("the policy is empty; it needs schema: and actions:")
        if not isinstance(doc, YamlMap):
            raise root.error(
                f"a policy must be a mapping with schema: and actions:, got {show(doc)}"
            )
        schema = _schema(doc, root)
        check_keys(doc, root, TOP_KEYS, required=("actions",))
        _check_versions(doc, root, TOP_KEYS, schema)
        actions = _actions(doc["actions"], root.key(doc, "actions"), schema)
        mode = cast(Mode, expect_choice(doc.get("mode", "enforce"), root.key(doc, "mode"), MODES))
        parsed = _sections(doc, root, sections, SectionContext(schema, frozenset(actions)))
        check_plain(doc, root)  # floats, dates and odd YAML types that nothing above rejected
        return cls(
            actions=types.MappingProxyType(actions),
            mode=mode,
            schema=schema,
            policy_hash=sha256(canonical_bytes(plain(doc))),
            source=source,
            path=path,
            sections=types.MappingProxyType(parsed),
        )

    def section(self, section: Section[T]) -> T:
        """The parsed value of ``section``; it must have been given to the loader."""
        if section.name not in self.sections:
            raise LookupError(
                f"the policy {self.source} was loaded without section {section.name!r}; "
                "pass it to Policy.from_file(..., sections=...)"
            )
        return cast(T, self.sections[section.name])

    def evaluate(self, name: str, arguments: Mapping[str, Any]) -> Evaluation:
        """The policy's answer for action ``name`` with ``arguments``; an unknown action is
        denied (``unknown_action``). Pure: the same inputs give the same answer."""
        entry = self.actions.get(name)
        if entry is None:
            return Evaluation(Decision.DENY, "unknown_action")
        return entry.evaluate(arguments)

    def effect_template(self, name: str) -> Template | None:
        entry = self.actions.get(name)
        return entry.effect if entry is not None else None

    def resource_template(self, name: str) -> Template | None:
        entry = self.actions.get(name)
        return entry.resource if entry is not None else None

    def window(self, name: str) -> timedelta | None:
        """How long after a commit the same effect key stays blocked (``None``: forever)."""
        entry = self.actions.get(name)
        return entry.window if entry is not None else None

    def budget(self, name: str) -> Budget | None:
        entry = self.actions.get(name)
        return entry.budget if entry is not None else None

    def approval_by_header_only(self, name: str) -> bool:
        """Whether a granted approval for ``name`` is used only when presented by its id."""
        entry = self.actions.get(name)
        return entry is not None and entry.approval == "header"

    def actions_without_effect(self) -> list[str]:
        """Names of the actions that have no ``effect:`` and so no duplicate protection."""
        return sorted(name for name, entry in self.actions.items() if entry.effect is None)


def _schema(doc: YamlMap, root: Where) -> str:
    expected = f"expected one of {', '.join(SCHEMAS)}"
    if "schema" not in doc:
        raise Where(root.source, "schema", root.line).error(f"missing; {expected}")
    schema = doc["schema"]
    if schema not in SCHEMAS:
        raise root.key(doc, "schema").error(f"unknown policy schema {show(schema)}, {expected}")
    return cast(str, schema)


def _sections(
    doc: YamlMap, root: Where, sections: Iterable[Section[Any]], context: SectionContext
) -> dict[str, object]:
    parsed: dict[str, object] = {}
    for section in (*KERNEL_SECTIONS, *sections):
        # Programming errors, not bad files: the format names every top-level key, once.
        if section.name not in TOP_KEYS or section.name in _OWN_KEYS:
            raise ValueError(f"{section!r} is not a top-level key that a room may parse")
        if section.name in parsed:
            raise ValueError(f"{section!r} is given to the loader twice")
        if section.name in doc:
            value = section.parse(doc[section.name], root.key(doc, section.name), context)
        else:
            value = section.empty
        parsed[section.name] = value
    return parsed


def _check_versions(entry: YamlMap, where: Where, since: Mapping[str, str], schema: str) -> None:
    if schema != SCHEMA_V1:
        return
    for key in entry:
        if since[key] != SCHEMA_V1:
            raise where.key(entry, key).error(
                f"{key!r} needs schema: {since[key]} (this file declares {schema})"
            )


def _actions(value: Any, where: Where, schema: str) -> dict[str, ActionPolicy]:
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
    _check_versions(value, where, ACTION_KEYS, schema)
    if ("decision" in value) == ("rules" in value):
        raise where.error("needs exactly one of decision: or rules:")

    def at(key: str) -> Where:
        return where.key(value, key)

    decision = _decision(value["decision"], at("decision")) if "decision" in value else None
    rules = _rules(value["rules"], at("rules")) if "rules" in value else ()
    return ActionPolicy(
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
