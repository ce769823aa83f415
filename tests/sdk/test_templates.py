"""Effect and resource templates: parsing and resolution."""

from __future__ import annotations

from typing import Any

import pytest

from ctrlrun import EffectKeyError
from ctrlrun.templates import TemplateSyntaxError, parse_template


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("refund:{payment_id}", ("payment_id",)),
        ("scale:{cluster}:{deployment}:{replicas}", ("cluster", "deployment", "replicas")),
        ("fixed", ()),
        ("{ä}", ("ä",)),
        ("{_x1}", ("_x1",)),
    ],
)
def test_parse(text: str, names: tuple[str, ...]) -> None:
    assert parse_template(text).names == names


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "}",
        "a{b",
        "a}b",
        "{{x}}",
        "{1x}",
        "{a.b}",
        "{a[0]}",
        "{x:>3}",
        "{}",
        "{ x }",
        7,
        None,
    ],
)
def test_parse_refuses(text: Any) -> None:
    with pytest.raises(TemplateSyntaxError):
        parse_template(text)


@pytest.mark.parametrize(
    ("text", "values", "resource", "expected"),
    [
        ("refund:{payment_id}", {"payment_id": "pi_1"}, None, "refund:pi_1"),
        ("n:{n}", {"n": 0}, None, "n:0"),
        ("n:{n}", {"n": -3}, None, "n:-3"),
        ("r:{resource}", {}, "acct:9", "r:acct:9"),
        ("r:{resource}", {"resource": "arg"}, None, "r:arg"),
    ],
)
def test_resolve(text: str, values: dict[str, Any], resource: str | None, expected: str) -> None:
    assert parse_template(text).resolve(values, resource=resource) == expected


@pytest.mark.parametrize(
    ("text", "values", "resource"),
    [
        ("k:{x}", {}, None),
        ("k:{x}", {"x": None}, None),
        ("k:{x}", {"x": ""}, None),
        ("k:{x}", {"x": True}, None),
        ("k:{x}", {"x": [1]}, None),
        ("k:{x}", {"x": {"a": 1}}, None),
        ("r:{resource}", {}, None),
        ("r:{resource}", {"resource": "arg"}, "also-a-resource"),
    ],
    ids=[
        "missing",
        "none",
        "empty",
        "bool",
        "list",
        "mapping",
        "no_resource",
        "ambiguous_resource",
    ],
)
def test_resolve_refuses(text: str, values: dict[str, Any], resource: str | None) -> None:
    with pytest.raises(EffectKeyError):
        parse_template(text).resolve(values, resource=resource)
