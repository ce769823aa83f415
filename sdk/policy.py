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
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from .action import canonical_bytes, sha256
from .budgets import Budget
from .config import policy_path
from .errors import PolicyError
from .operators import OPERATORS
from .policy_actions import ACTION_KEYS as ACTION_KEYS
from .policy_actions import SCHEMA_V1 as SCHEMA_V1
from .policy_actions import SCHEMA_V2 as SCHEMA_V2
from .policy_actions import ActionPolicy as ActionPolicy
from .policy_actions import Decision as Decision
from .policy_actions import Evaluation as Evaluation
from .policy_actions import Rule as Rule
from .policy_actions import check_versions, parse_actions
from .policy_actions import parse_window as parse_window
from .policy_sections import Section, SectionContext
from .templates import Template
from .yamlstrict import (
    Where,
    YamlMap,
    check_keys,
    check_plain,
    expect_choice,
    load,
    plain,
    show,
)

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
_OWN_KEYS = frozenset({"schema", "actions", "mode"})
MODES = ("enforce", "observe")

Mode = Literal["enforce", "observe"]
T = TypeVar("T")


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
        check_versions(doc, root, TOP_KEYS, schema)
        actions = parse_actions(doc["actions"], root.key(doc, "actions"), schema)
        mode = cast(Mode, expect_choice(doc.get("mode", "enforce"), root.key(doc, "mode"), MODES))
        parsed = _sections(doc, root, sections, SectionContext(schema, frozenset(actions)))
        _check_quorums(
            doc, root, actions, cast(Mapping[str, Any], parsed.get(OPERATORS.name) or {})
        )
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

    def may_ask(self, name: str, decision: Decision) -> bool:
        """Whether a call decided ``decision`` may need an approval request (its id is made
        before the transaction): ``approve``, or a budget that asks past its limit."""
        entry = self.actions.get(name)
        over = entry is not None and entry.asks_past_budget
        return decision is Decision.APPROVE or (over and decision is Decision.ALLOW)

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


def _check_quorums(
    doc: YamlMap, root: Where, actions: Mapping[str, ActionPolicy], operators: Mapping[str, Any]
) -> None:
    """A quorum needs operators with names, at least as many as it counts."""
    for name, entry in actions.items():
        if entry.approvals_required <= 1:
            continue
        at = root.key(doc, "actions").key(doc["actions"], name)
        where = at.key(doc["actions"][name], "approvals_required")
        if not operators:
            raise where.error(
                f"a quorum of {entry.approvals_required} needs an operators: section naming "
                "them: without it any --as name counts, so one person could approve "
                f"{entry.approvals_required} times"
            )
        if entry.approvals_required > len(operators):
            raise where.error(
                f"{entry.approvals_required} approvals can never be given: operators: names "
                f"only {len(operators)}"
            )


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
