"""Malformed policy files: each is refused with one line naming file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrlrun.errors import PolicyError
from ctrlrun.policy import Policy

V1 = "schema: ctrlrun.policy/v1\n"
V2 = "schema: ctrlrun.policy/v2\n"
ALLOW = "actions:\n  a: {decision: allow}\n"

# (id, document, line of the error, fragments the message must contain)
CASES: list[tuple[str, str, int, tuple[str, ...]]] = [
    ("yaml_syntax", V2 + "actions:\n  a: b: c\n", 3, ("not valid YAML",)),
    ("yaml_tab", V2 + "actions:\n\ta: {}\n", 3, ("not valid YAML",)),
    ("yaml_unclosed", V2 + "actions: {a: {decision: allow}\n", 3, ("not valid YAML",)),
    ("yaml_python_tag", V2 + "actions: !!python/object:os.system {}\n", 2, ("not valid YAML",)),
    ("yaml_bad_date", V2 + ALLOW + "mode: 2024-13-01\n", 4, ("not a valid date",)),
    ("recursive_alias", V2 + "actions:\n  a:\n    rules: &r [*r]\n", 4, ("a.rules", "recursive")),
    ("duplicate_top", V2 + ALLOW + "actions: {}\n", 4, ("duplicate key 'actions'", "line 2")),
    (
        "duplicate_in_entry",
        V2 + "actions:\n  a:\n    decision: allow\n    decision: deny\n",
        5,
        ("duplicate key 'decision'", "first on line 4"),
    ),
    ("duplicate_action", V2 + ALLOW + "  a: {decision: deny}\n", 4, ("duplicate key 'a'",)),
    ("not_a_mapping", "- schema\n- actions\n", 1, ("must be a mapping", "a list")),
    ("scalar_document", "just words\n", 1, ("must be a mapping", "'just words'")),
    ("empty_document", "# nothing\n", 1, ("empty",)),
    ("missing_schema", ALLOW, 1, ("schema:", "missing", "ctrlrun.policy/v1")),
    (
        "unknown_schema",
        "schema: ctrlrun.policy/v9\n" + ALLOW,
        1,
        ("schema:", "'ctrlrun.policy/v9'", "ctrlrun.policy/v2"),
    ),
    (
        "schema_not_string",
        "schema: 2\n" + ALLOW,
        1,
        (
            "schema:",
            "unknown policy schema 2",
        ),
    ),
    ("missing_actions", V2 + "mode: enforce\n", 1, ("missing required key 'actions'",)),
    ("actions_list", V2 + "actions:\n  - a\n", 2, ("actions:", "must be a mapping")),
    ("actions_null", V2 + "actions:\n", 2, ("actions:", "None")),
    ("unknown_top_key", V2 + ALLOW + "environment: prod\n", 4, ("environment:", "unknown key")),
    ("non_string_top_key", V2 + ALLOW + "1: x\n", 4, ("key 1 is not a string",)),
    ("action_not_mapping", V2 + "actions:\n  a: allow\n", 3, ("actions.a:", "'allow'")),
    ("action_name_int", V2 + "actions:\n  7: {decision: allow}\n", 3, ("actions.7:", "name")),
    (
        "unknown_action_key",
        V2 + "actions:\n  a:\n    decision: allow\n    effekt: 'x:{id}'\n",
        5,
        ("actions.a.effekt:", "unknown key", "effect"),
    ),
    (
        "decision_and_rules",
        V2 + "actions:\n  a:\n    decision: allow\n    rules: [{decision: deny}]\n",
        3,
        ("actions.a:", "exactly one of decision: or rules:"),
    ),
    (
        "neither_decision_nor_rules",
        V2 + "actions:\n  a:\n    effect: 'x:{id}'\n",
        3,
        ("actions.a:", "exactly one"),
    ),
    ("empty_rules", V2 + "actions:\n  a:\n    rules: []\n", 4, ("actions.a.rules:", "empty")),
    ("rules_mapping", V2 + "actions:\n  a:\n    rules: {decision: allow}\n", 4, ("a.rules:",)),
    (
        "rule_not_mapping",
        V2 + "actions:\n  a:\n    rules:\n      - allow\n",
        5,
        ("actions.a.rules[0]:", "must be a mapping"),
    ),
    (
        "rule_without_decision",
        V2 + "actions:\n  a:\n    rules:\n      - when: {n_eq: 1}\n",
        5,
        ("actions.a.rules[0]:", "missing required key 'decision'"),
    ),
    (
        "unknown_rule_key",
        V2 + "actions:\n  a:\n    rules:\n      - decision: allow\n        unless: {n_eq: 1}\n",
        6,
        ("actions.a.rules[0].unless:", "unknown key"),
    ),
    (
        "empty_when",
        V2 + "actions:\n  a:\n    rules:\n      - when: {}\n        decision: allow\n",
        5,
        ("actions.a.rules[0].when:", "must not be empty"),
    ),
    (
        "null_when",
        V2 + "actions:\n  a:\n    rules:\n      - decision: allow\n        when:\n",
        6,
        ("actions.a.rules[0].when:", "None"),
    ),
    ("bad_decision", V2 + "actions:\n  a: {decision: maybe}\n", 3, ("a.decision:", "'maybe'")),
    ("decision_yes", V2 + "actions:\n  a:\n    decision: yes\n", 4, ("a.decision:", "'yes'")),
    ("decision_bool", V2 + "actions:\n  a:\n    decision: true\n", 4, ("a.decision:", "True")),
    (
        "rule_bad_decision",
        V2 + "actions:\n  a:\n    rules:\n      - decision: Allow\n",
        5,
        ("actions.a.rules[0].decision:", "'Allow'"),
    ),
    (
        "float_operand",
        V2
        + "actions:\n  stripe.refund:\n    rules:\n"
        + "      - when:\n          amount_lt: 1.5\n        decision: allow\n",
        6,
        ("actions.stripe.refund.rules[0].when.amount_lt:", "must be an integer, got 1.5"),
    ),
    (
        "bool_operand",
        V2 + "actions:\n  a:\n    rules:\n      - {when: {n_gte: true}, decision: allow}\n",
        5,
        ("rules[0].when.n_gte:", "must be an integer, got True"),
    ),
    (
        "string_operand",
        V2 + "actions:\n  a:\n    rules:\n      - {when: {n_gt: '5'}, decision: allow}\n",
        5,
        ("rules[0].when.n_gt:", "'5'"),
    ),
    (
        "float_nested_in_eq",
        V2
        + "actions:\n  a:\n    rules:\n      - when:\n          meta_eq:\n"
        + "            tags: [1, 2.5]\n        decision: allow\n",
        7,
        ("rules[0].when.meta_eq.tags[1]:", "floats are not allowed", "2.5"),
    ),
    (
        "float_in_list_operand",
        V2 + "actions:\n  a:\n    rules:\n      - when: {n_in: [1, 0.5]}\n        decision: deny\n",
        5,
        ("rules[0].when.n_in[1]:", "floats"),
    ),
    (
        "date_operand",
        V2
        + "actions:\n  a:\n    rules:\n      - when: {day_lt: 2024-01-01}\n"
        + "        decision: deny\n",
        5,
        ("rules[0].when.day_lt:", "unquoted YAML date 2024-01-01"),
    ),
    (
        "date_eq_operand",
        V2
        + "actions:\n  a:\n    rules:\n      - when: {day_eq: 2024-01-01}\n"
        + "        decision: deny\n",
        5,
        ("rules[0].when.day_eq:", "unquoted YAML date"),
    ),
    (
        "in_not_list",
        V2 + "actions:\n  a:\n    rules:\n      - when: {c_in: usd}\n        decision: deny\n",
        5,
        ("rules[0].when.c_in:", "must be a list"),
    ),
    (
        "unknown_operator",
        V2 + "actions:\n  a:\n    rules:\n      - when: {amount_le: 5}\n        decision: deny\n",
        5,
        ("rules[0].when.amount_le:", "unknown operator 'le'"),
    ),
    (
        "no_operator",
        V2 + "actions:\n  a:\n    rules:\n      - when: {amount: 5}\n        decision: deny\n",
        5,
        ("rules[0].when.amount:", "<argument>_<op>"),
    ),
    (
        "reserved_subject_agent",
        V2 + "actions:\n  a:\n    rules:\n      - when: {agent_eq: bot}\n        decision: deny\n",
        5,
        ("rules[0].when.agent_eq:", "'agent' is reserved"),
    ),
    (
        "reserved_subject_resource",
        V2 + "actions:\n  a:\n    rules:\n      - {when: {resource_in: [x]}, decision: deny}\n",
        5,
        ("rules[0].when.resource_in:", "reserved"),
    ),
    (
        "bad_template",
        V2 + "actions:\n  a:\n    decision: allow\n    effect: 'r:{id-x}'\n",
        5,
        ("actions.a.effect:", "not a plain identifier"),
    ),
    (
        "stray_brace",
        V2 + "actions:\n  a:\n    decision: allow\n    resource: 'r:{id'\n",
        5,
        ("actions.a.resource:", "stray brace"),
    ),
    (
        "empty_template",
        V2 + "actions:\n  a:\n    decision: allow\n    effect: ''\n",
        5,
        ("actions.a.effect:", "non-empty string"),
    ),
    (
        "v2_key_under_v1_effect",
        V1 + "actions:\n  a:\n    decision: allow\n    effect: 'r:{id}'\n",
        5,
        ("actions.a.effect:", "needs schema: ctrlrun.policy/v2"),
    ),
    (
        "v2_key_under_v1_window",
        V1 + "actions:\n  a:\n    decision: allow\n    window: 10m\n",
        5,
        ("actions.a.window:", "ctrlrun.policy/v2", "ctrlrun.policy/v1"),
    ),
    (
        "v2_key_under_v1_mode",
        V1 + ALLOW + "mode: observe\n",
        4,
        ("mode:", "needs schema: ctrlrun.policy/v2"),
    ),
    ("v2_key_under_v1_upstreams", V1 + ALLOW + "upstreams: {}\n", 4, ("upstreams:", "v2")),
    ("v2_key_under_v1_agents", V1 + ALLOW + "agents: {}\n", 4, ("agents:", "v2")),
    ("bad_mode", V2 + ALLOW + "mode: off\n", 4, ("mode:", "enforce, observe", "'off'")),
    ("bool_mode", V2 + ALLOW + "mode: true\n", 4, ("mode:", "True")),
    (
        "bad_approval_use",
        V2 + "actions:\n  a:\n    decision: approve\n    approval: headers\n",
        5,
        ("actions.a.approval:", "resend, header", "'headers'"),
    ),
    (
        "v2_key_under_v1_approval",
        V1 + "actions:\n  a:\n    decision: approve\n    approval: header\n",
        5,
        ("actions.a.approval:", "ctrlrun.policy/v2"),
    ),
    (
        "bad_window",
        V2 + "actions:\n  a:\n    decision: allow\n    window: 10 minutes\n",
        5,
        ("actions.a.window:", "'10 minutes'"),
    ),
    (
        "zero_window",
        V2 + "actions:\n  a:\n    decision: allow\n    window: 0\n",
        5,
        ("actions.a.window:", "got 0"),
    ),
    (
        "float_window",
        V2 + "actions:\n  a:\n    decision: allow\n    window: 1.5\n",
        5,
        ("actions.a.window:", "1.5"),
    ),
    (
        "huge_window",
        V2 + "actions:\n  a:\n    decision: allow\n    window: 99999999999999d\n",
        5,
        ("actions.a.window:", "too long"),
    ),
]


def _ids() -> list[str]:
    return [case[0] for case in CASES]


def test_the_table_has_many_distinct_documents() -> None:
    assert len({case[1] for case in CASES}) == len(CASES) >= 25
    assert len(set(_ids())) == len(CASES)


@pytest.mark.parametrize(("doc", "line", "fragments"), [c[1:] for c in CASES], ids=_ids())
def test_from_file_names_file_line_and_key(
    tmp_path: Path, doc: str, line: int, fragments: tuple[str, ...]
) -> None:
    path = tmp_path / "ctrlrun.yaml"
    path.write_text(doc)
    with pytest.raises(PolicyError) as info:
        Policy.from_file(path)
    message = str(info.value)
    assert "\n" not in message
    assert "Traceback" not in message
    assert message.startswith(f"{path}:{line}: "), message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize(("doc", "line", "fragments"), [c[1:] for c in CASES], ids=_ids())
def test_from_yaml_names_its_source(doc: str, line: int, fragments: tuple[str, ...]) -> None:
    with pytest.raises(PolicyError) as info:
        Policy.from_yaml(doc, source="inline.yaml")
    assert str(info.value).startswith(f"inline.yaml:{line}: ")
    assert info.value.__cause__ is None  # one line, no chained traceback for expected errors


@pytest.mark.parametrize(
    ("setup", "fragments"),
    [
        ("missing", ("policy file", "missing.yaml", "could not be read")),
        ("directory", ("policy file", "could not be read")),
        ("not_utf8", (":2: not valid UTF-8",)),
    ],
)
def test_unreadable_files(tmp_path: Path, setup: str, fragments: tuple[str, ...]) -> None:
    path = tmp_path / "missing.yaml"
    if setup == "directory":
        path = tmp_path / "dir.yaml"
        path.mkdir()
    elif setup == "not_utf8":
        path = tmp_path / "latin1.yaml"
        path.write_bytes(b"schema: ctrlrun.policy/v2\nactions: {caf\xe9: {decision: allow}}\n")
    with pytest.raises(PolicyError) as info:
        Policy.from_file(path)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize(
    "section",
    [
        "upstreams:\n  s:\n    profile: grpc\n    url: ftp://x.test/v1\n    host: x\n",
        "agents:\n  bot:\n    token: s3cret\n",
        "upstreams: [not, a, mapping]\nagents: 7\n",
    ],
)
def test_the_proxy_sections_are_the_proxys_business(section: str) -> None:
    """Without the proxy's sections, the loader accepts them unread (tests/proxy checks them)."""
    policy = Policy.from_yaml(V2 + ALLOW + section)
    assert policy.evaluate("a", {}).decision == "allow"
    assert set(policy.sections) == {"operators"}  # the kernel's own, and only those


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("operators:\n  alice: {token: s3cret}\n", "token"),
        ("operators:\n  alice: {token_env: 'not a name'}\n", "environment variable"),
        ("operators:\n  'al ice': {token_env: A}\n", "operator name"),
        ("operators: [alice]\n", "mapping"),
    ],
)
def test_a_bad_operators_section_is_one_clear_error(section: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        Policy.from_yaml(V2 + ALLOW + section)


@pytest.mark.parametrize(
    ("section", "line", "fragment"),
    [
        ("upstreams:\n  s: {url: 1.5}\n", 5, "upstreams.s.url: floats are not allowed"),
        ("agents:\n  bot: {since: 2024-01-01}\n", 5, "unquoted YAML date"),
    ],
)
def test_unread_sections_are_still_plain_yaml(section: str, line: int, fragment: str) -> None:
    with pytest.raises(PolicyError) as info:
        Policy.from_yaml(V2 + ALLOW + section, source="p.yaml")
    assert str(info.value).startswith(f"p.yaml:{line}: ")
    assert fragment in str(info.value)


def test_alias_bomb_is_refused() -> None:
    lines = [V2, "actions:\n  a:\n    decision: allow\n", "bomb:\n"]
    lines.append("  l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n")
    for i in range(1, 8):
        refs = ", ".join([f"*l{i - 1}"] * 10)
        lines.append(f"  l{i}: &l{i} [{refs}]\n")
    with pytest.raises(PolicyError, match="expands to more than"):
        Policy.from_yaml("".join(lines))
