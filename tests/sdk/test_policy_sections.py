"""Top-level sections parsed by their owner: kernel sections always, a room's when handed over."""

from __future__ import annotations

from typing import Any

import pytest

from ctrlrun import policy as policy_module
from ctrlrun.errors import PolicyError
from ctrlrun.policy import SCHEMA_V2, Policy
from ctrlrun.policy_sections import Section, SectionContext
from ctrlrun.yamlstrict import Where, expect_str

V1 = "schema: ctrlrun.policy/v1\n"
V2 = "schema: ctrlrun.policy/v2\n"
ALLOW = "actions:\n  a: {decision: allow}\n  b: {decision: deny}\n"
seen: list[SectionContext] = []


def _team(value: Any, where: Where, context: SectionContext) -> str:
    seen.append(context)
    return expect_str(value, where)


NOTIFY = Section("notify", _team, empty="nobody")


@pytest.fixture
def notify_is_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A section the file format does not have yet, as a later kernel or room would add it."""
    monkeypatch.setitem(policy_module.TOP_KEYS, "notify", SCHEMA_V2)


def test_a_rooms_section_is_parsed_when_handed_over(notify_is_a_key: None) -> None:
    seen.clear()
    loaded = Policy.from_yaml(V2 + ALLOW + "notify: ops\n", sections=(NOTIFY,))
    assert loaded.section(NOTIFY) == "ops"
    assert seen == [SectionContext(SCHEMA_V2, frozenset({"a", "b"}))]
    assert Policy.from_yaml(V2 + ALLOW, sections=(NOTIFY,)).section(NOTIFY) == "nobody"


def test_without_it_the_section_is_kept_unread(notify_is_a_key: None) -> None:
    loaded = Policy.from_yaml(V2 + ALLOW + "notify: [1, 2]\n")
    with pytest.raises(LookupError, match="without section 'notify'"):
        loaded.section(NOTIFY)


def test_its_errors_name_file_line_and_key(notify_is_a_key: None) -> None:
    with pytest.raises(PolicyError) as info:
        Policy.from_yaml(V2 + ALLOW + "notify: 7\n", source="p.yaml", sections=(NOTIFY,))
    assert str(info.value).startswith("p.yaml:5: notify: ")
    with pytest.raises(
        PolicyError, match=r"^p.yaml:5: notify: 'notify' needs schema: ctrlrun.policy/v2"
    ):
        Policy.from_yaml(V1 + ALLOW + "notify: ops\n", source="p.yaml")


def test_a_kernel_section_is_read_by_every_load(
    notify_is_a_key: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(policy_module, "KERNEL_SECTIONS", (NOTIFY,))
    assert Policy.from_yaml(V2 + ALLOW + "notify: ops\n").section(NOTIFY) == "ops"
    with pytest.raises(PolicyError, match="notify: "):
        Policy.from_yaml(V2 + ALLOW + "notify: 7\n")


@pytest.mark.parametrize(
    ("sections", "fragment"),
    [
        ((Section("telemetry", _team, ""),), "not a top-level key"),  # not in the file format
        ((Section("actions", _team, ""),), "not a top-level key"),  # the loader's own
        ((NOTIFY, Section("notify", _team, "")), "twice"),
    ],
)
def test_programming_errors_are_loud(
    notify_is_a_key: None, sections: tuple[Section[Any], ...], fragment: str
) -> None:
    with pytest.raises(ValueError, match=fragment):
        Policy.from_yaml(V2 + ALLOW, sections=sections)


def test_a_section_in_the_file_that_nobody_names_is_still_an_unknown_key() -> None:
    with pytest.raises(PolicyError, match=r"^<string>:5: telemetry: unknown key"):
        Policy.from_yaml(V2 + ALLOW + "telemetry: {default: deny}\n")
