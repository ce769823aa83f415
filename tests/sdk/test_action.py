"""Actions: canonical arguments, floats refused at any depth, a stable hash."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from ctrlrun import Action, InvalidArgument, Principal, action_hash, canonicalize
from ctrlrun.action import canonical_bytes, iso, new_id, parse_iso

AGENT = Principal("agent-1")


@pytest.mark.parametrize(
    ("arguments", "where"),
    [
        ({"amount": 1.5}, "arguments.amount"),
        ({"amount": float("nan")}, "arguments.amount"),
        ({"meta": {"rate": 0.1}}, "arguments.meta.rate"),
        ({"items": [1, 2, 3.0]}, "arguments.items[2]"),
        ({"deep": [{"x": [{"y": 2.5}]}]}, "arguments.deep[0].x[0].y"),
    ],
)
def test_float_refused_at_any_depth(arguments: dict[str, Any], where: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(where)) as info:
        Action("refund", arguments, AGENT)
    assert "float" in str(info.value)


@pytest.mark.parametrize(
    "value",
    [Decimal("1.5"), {1, 2}, b"bytes", datetime(2026, 1, 1, tzinfo=UTC), object(), {1: "int key"}],
    ids=["decimal", "set", "bytes", "datetime", "object", "int_key"],
)
def test_other_unrepresentable_values_refused(value: Any) -> None:
    with pytest.raises(InvalidArgument):
        Action("refund", {"v": value}, AGENT)


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, -7, 10**30, "", "naïve ☃", [], [1, "a", None], {"a": {"b": [True]}}],
)
def test_allowed_values_roundtrip(value: Any) -> None:
    action = Action("refund", {"v": value}, AGENT)
    assert action.canonical_arguments == {"v": value}


def test_tuples_canonicalize_like_lists() -> None:
    a = Action("x", {"v": (1, 2)}, AGENT)
    b = Action("x", {"v": [1, 2]}, AGENT)
    assert a.hash == b.hash


def test_canonical_form_sorted_compact_and_hash() -> None:
    action = Action("refund", {"b": 1, "a": "é"}, Principal("bot", "u1"), resource="acct:1")
    assert canonicalize(action) == (
        b'{"arguments":{"a":"\xc3\xa9","b":1},"environment":"production","name":"refund",'
        b'"principal":{"agent":"bot","user":"u1"},"resource":"acct:1","schema":"ctrlrun.action/v1"}'
    )
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", action_hash(action))


def test_hash_ignores_action_id_but_not_content() -> None:
    a = Action("refund", {"amount": 1}, AGENT)
    b = Action("refund", {"amount": 1}, AGENT)
    c = Action("refund", {"amount": 2}, AGENT)
    d = Action("refund", {"amount": 1}, Principal("agent-2"))
    assert a.action_id != b.action_id
    assert a.hash == b.hash
    assert len({a.hash, c.hash, d.hash}) == 3


def test_canonical_arguments_are_fresh_copies() -> None:
    source = {"meta": {"k": [1]}}
    action = Action("x", source, AGENT)
    copy = action.canonical_arguments
    copy["meta"]["k"].append(2)
    source["meta"]["k"].append(3)
    assert action.canonical_arguments == {"meta": {"k": [1]}}


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda: Action("", {}, AGENT), "action name"),
        (lambda: Action("x", {}, AGENT, resource=""), "resource"),
        (lambda: Principal(""), "agent"),
        (lambda: Principal("a", ""), "user"),
    ],
    ids=["empty_name", "empty_resource", "empty_agent", "empty_user"],
)
def test_empty_names_refused(build: Any, fragment: str) -> None:
    with pytest.raises(InvalidArgument, match=fragment):
        build()


def test_ids_and_timestamps() -> None:
    assert re.fullmatch(r"act_[0-9a-f]{32}", new_id("act"))
    ts = datetime(2026, 9, 7, 11, 44, 30, 625999, tzinfo=UTC)
    assert iso(ts) == "2026-09-07T11:44:30.625Z"
    assert parse_iso(iso(ts)) == ts.replace(microsecond=625000)


def test_canonical_bytes_refuses_floats() -> None:
    with pytest.raises(InvalidArgument):
        canonical_bytes({"x": 1.0})
