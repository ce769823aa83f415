"""Conditions: parsing ``<argument>_<op>: operand`` and evaluating it type-strictly."""

from __future__ import annotations

from typing import Any

import pytest

from ctrlrun.conditions import Condition, Op, parse_condition, parse_conditions, strict_equal
from ctrlrun.errors import PolicyError
from ctrlrun.yamlstrict import Where, load

WHERE = Where("p.yaml", "when", 7)


def _operand(text: str) -> Any:
    """An operand as the strict loader produces it (lists and mappings with lines)."""
    return load(f"v: {text}\n", source="t")["v"]


@pytest.mark.parametrize(
    ("key", "operand", "expected"),
    [
        ("amount_lt", "5", Condition("amount", Op.LT, 5)),
        ("amount_lte", "-5", Condition("amount", Op.LTE, -5)),
        ("amount_gt", "0", Condition("amount", Op.GT, 0)),
        ("amount_gte", "10000000000000000000000", Condition("amount", Op.GTE, 10**22)),
        ("amount_neq", "5", Condition("amount", Op.NEQ, 5)),
        ("amount_eq", "usd", Condition("amount", Op.EQ, "usd")),
        ("payment_id_eq", "pi_1", Condition("payment_id", Op.EQ, "pi_1")),  # split on the last _
        ("x_in_in", "[a]", Condition("x_in", Op.IN, ("a",))),
        ("flag_eq", "true", Condition("flag", Op.EQ, True)),
        ("owner_eq", "null", Condition("owner", Op.EQ, None)),
        ("meta_eq", "{a: [1, b]}", Condition("meta", Op.EQ, {"a": [1, "b"]})),
        ("c_in", "[usd, 1, true, null]", Condition("c", Op.IN, ("usd", 1, True, None))),
        ("c_in", "[]", Condition("c", Op.IN, ())),
    ],
)
def test_parse_condition(key: str, operand: str, expected: Condition) -> None:
    assert parse_condition(key, _operand(operand), WHERE) == expected


@pytest.mark.parametrize(
    ("key", "operand", "fragment"),
    [
        ("amount_lt", "1.5", "operand must be an integer, got 1.5"),
        ("amount_lt", "true", "operand must be an integer, got True"),
        ("amount_gte", "'5'", "operand must be an integer, got '5'"),
        ("amount_gt", "null", "got None"),
        ("amount_lte", "[1]", "got a list"),
        ("day_lt", "2024-01-01", "unquoted YAML date 2024-01-01"),
        ("amount_eq", "1.5", "floats are not allowed"),
        ("amount_eq", "2024-01-01 10:00:00", "unquoted YAML date"),
        ("meta_eq", "{a: {b: .inf}}", "floats are not allowed"),
        ("c_in", "usd", "must be a list, got 'usd'"),
        ("c_in", "{a: 1}", "must be a list, got a mapping"),
        ("c_in", "[1, 2.0]", "floats"),
        ("amount_le", "1", "unknown operator 'le'"),
        ("amount_between", "1", "unknown operator 'between'"),
        ("amount", "1", "<argument>_<op>"),
        ("_eq", "1", "<argument>_<op>"),
        ("agent_eq", "bot", "'agent' is reserved"),
        ("user_eq", "u", "'user' is reserved"),
        ("principal_eq", "p", "'principal' is reserved"),
        ("resource_in", "[r]", "'resource' is reserved"),
        ("action_id_eq", "act_1", "'action_id' is reserved"),
        ("environment_neq", "prod", "'environment' is reserved"),
    ],
)
def test_parse_condition_errors(key: str, operand: str, fragment: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_condition(key, _operand(operand), WHERE)
    message = str(info.value)
    # nested values carry the line of their own YAML node; the rest the line of the key
    nested = fragment.startswith("float") and operand.startswith(("[", "{"))
    assert message.startswith("p.yaml:1: when" if nested else "p.yaml:7: when"), message
    assert fragment in message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("{}", "must not be empty"), ("null", "got None"), ("[a_eq]", "got a list")],
)
def test_parse_conditions_needs_a_non_empty_mapping(text: str, fragment: str) -> None:
    with pytest.raises(PolicyError, match=fragment):
        parse_conditions(_operand(text), WHERE)


def test_parse_conditions_keeps_order_and_names_the_bad_key() -> None:
    when = load("when:\n  a_eq: 1\n  b_lt: 2\n  c_zz: 3\n", source="f.yaml")["when"]
    with pytest.raises(PolicyError) as info:
        parse_conditions(when, Where("f.yaml", "when", 1))
    assert str(info.value).startswith("f.yaml:4: when.c_zz: unknown operator 'zz'")
    del when["c_zz"]
    conditions = parse_conditions(when, Where("f.yaml", "when", 1))
    assert [c.key for c in conditions] == ["a_eq", "b_lt"]


@pytest.mark.parametrize(
    ("left", "right", "equal"),
    [
        (1, 1, True),
        (True, True, True),
        (False, False, True),
        (None, None, True),
        ("a", "a", True),
        (True, 1, False),
        (1, True, False),
        (False, 0, False),
        (0, None, False),
        ("", None, False),
        ("1", 1, False),
        (1, 1.0, False),
        (1.0, 1.0, False),  # floats never compare equal: they are not allowed at all
        ([1], 1, False),
        ([1, 2], (1, 2), True),
        ([1, 2], [2, 1], False),
        ([1], [1, 1], False),
        ([True], [1], False),
        ({"a": 1}, {"a": 1}, True),
        ({"a": 1, "b": [1]}, {"b": [1], "a": 1}, True),
        ({"a": 1}, {"a": True}, False),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        ({"a": 1}, [("a", 1)], False),
        ({}, [], False),
    ],
)
def test_strict_equal(left: Any, right: Any, equal: bool) -> None:
    assert strict_equal(left, right) is equal
    assert strict_equal(right, left) is equal


@pytest.mark.parametrize(
    ("condition", "arguments", "holds"),
    [
        (Condition("n", Op.LT, 5), {"n": 4}, True),
        (Condition("n", Op.LT, 5), {"n": 5}, False),
        (Condition("n", Op.LTE, 5), {"n": 5}, True),
        (Condition("n", Op.LTE, 5), {"n": 6}, False),
        (Condition("n", Op.GT, 5), {"n": 6}, True),
        (Condition("n", Op.GT, 5), {"n": 5}, False),
        (Condition("n", Op.GTE, 5), {"n": 5}, True),
        (Condition("n", Op.GTE, 5), {"n": 4}, False),
        (Condition("n", Op.GTE, -5), {"n": True}, False),
        (Condition("n", Op.LT, 5), {"n": False}, False),
        (Condition("n", Op.LT, 5), {"n": 4.0}, False),
        (Condition("n", Op.LT, 5), {"n": "4"}, False),
        (Condition("n", Op.LT, 5), {"n": None}, False),
        (Condition("n", Op.LT, 5), {"m": 4}, False),
        (Condition("n", Op.EQ, 5), {"n": 5}, True),
        (Condition("n", Op.EQ, 5), {"n": True}, False),
        (Condition("n", Op.EQ, None), {"n": None}, True),
        (Condition("n", Op.EQ, None), {}, False),
        (Condition("n", Op.NEQ, 5), {"n": 6}, True),
        (Condition("n", Op.NEQ, 5), {"n": "5"}, True),
        (Condition("n", Op.NEQ, 5), {"n": 5}, False),
        (Condition("n", Op.NEQ, 5), {}, False),  # missing: false for every operator
        (Condition("c", Op.IN, ("usd", "eur")), {"c": "eur"}, True),
        (Condition("c", Op.IN, ("usd", "eur")), {"c": "gbp"}, False),
        (Condition("c", Op.IN, (1, 2)), {"c": True}, False),
        (Condition("c", Op.IN, (True,)), {"c": 1}, False),
        (Condition("c", Op.IN, ()), {"c": "usd"}, False),
        (Condition("c", Op.IN, ("usd",)), {}, False),
    ],
)
def test_holds(condition: Condition, arguments: dict[str, Any], holds: bool) -> None:
    assert condition.holds(arguments) is holds


WARN_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  refund:
    rules:
      - when: {amount_lte: 100}
        decision: allow
      - decision: deny
  payout:
    rules:
      - when: {amount_lte: 100}
        decision: allow
      - decision: deny
"""


def test_a_missing_argument_warns_once_per_action_and_condition(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    from ctrlrun import Policy

    policy = Policy.from_yaml(WARN_POLICY)
    with caplog.at_level(logging.WARNING, logger="ctrlrun"):
        for _ in range(5):
            assert policy.evaluate("refund", {"currency": "usd"}).reason == "rule[1]"
            assert policy.evaluate("payout", {}).reason == "rule[1]"
            assert policy.evaluate("refund", {"amount": "12"}).reason == "rule[1]"
    missing = [r.getMessage() for r in caplog.records if "no argument" in r.getMessage()]
    assert len(missing) == 2
    assert "actions.refund.rules[0].when.amount_lte" in missing[0]
    assert "actions.payout.rules[0].when.amount_lte" in missing[1]
    assert "(arguments: currency)" in missing[0]
    not_int = [r.getMessage() for r in caplog.records if "not an integer" in r.getMessage()]
    assert len(not_int) == 1 and "actions.refund.rules[0].when.amount_lte" in not_int[0]


def test_conditions_compare_by_value_not_by_where_they_are_written() -> None:
    doc = load("amount_lte: 5\n", source="t")
    here = parse_condition("amount_lte", 5, WHERE.key(doc, "amount_lte"))
    assert here == Condition("amount", Op.LTE, 5) and here.origin == "when.amount_lte"
