"""Strict YAML for configuration: duplicate keys refused, every value's line kept.

``load`` parses with a SafeLoader whose mappings and sequences remember the line of each key
and item, so a validator can say ``file:line: key.path: what is wrong`` in one line.
Differences from PyYAML's SafeLoader, all on purpose:

- a duplicate key is an error naming its line and the line of the first one;
- booleans are YAML 1.2's (``true``/``false`` only), so ``reconcile: off`` is the string it
  looks like and a key ``on:`` stays a string;
- a recursive alias, or aliases that expand past ``MAX_NODES`` values, are refused.

Floats, dates and other non-JSON values still load; ``check_plain`` refuses them, after the
specific validators have had a chance to say something more precise.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from .errors import PolicyError

MAX_NODES = 1_000_000
_BOOL_TAG = "tag:yaml.org,2002:bool"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlMap(dict[Any, Any]):
    """A mapping that knows its own line and the line of each of its keys."""

    def __init__(self, line: int = 1) -> None:
        super().__init__()
        self.line = line
        self.key_lines: dict[Any, int] = {}


class YamlList(list[Any]):
    """A sequence that knows its own line and the line of each of its items."""

    def __init__(self, line: int = 1) -> None:
        super().__init__()
        self.line = line
        self.item_lines: list[int] = []


def show(value: Any) -> str:
    """A value as an error message shows it."""
    if isinstance(value, (datetime.date, datetime.datetime)):
        return f"an unquoted YAML date {value.isoformat()} (quote it)"
    if isinstance(value, YamlMap):
        return "a mapping"
    if isinstance(value, YamlList):
        return "a list"
    return repr(value)


@dataclass(frozen=True)
class Where:
    """A place in a loaded document: file, dotted key path and line."""

    source: str
    path: str
    line: int

    def key(self, mapping: YamlMap, key: Any) -> Where:
        path = f"{self.path}.{key}" if self.path else str(key)
        return Where(self.source, path, mapping.key_lines.get(key, mapping.line))

    def index(self, seq: YamlList, i: int) -> Where:
        line = seq.item_lines[i] if i < len(seq.item_lines) else seq.line
        return Where(self.source, f"{self.path}[{i}]", line)

    def error(self, what: str) -> PolicyError:
        prefix = f"{self.path}: " if self.path else ""
        return PolicyError(_one_line(f"{self.source}:{self.line}: {prefix}{what}"))


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


class DuplicateKey(ConstructorError):
    """A mapping that names the same key twice."""


class _Resolver(yaml.resolver.Resolver):
    """PyYAML's implicit types, with YAML 1.2 booleans."""


# PyYAML's resolvers minus YAML 1.1's yes/no/on/off booleans; YAML 1.2's come back below.
_Resolver.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.resolver.Resolver.yaml_implicit_resolvers.items()
}
_Resolver.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


class _Constructor(yaml.constructor.SafeConstructor):
    def construct_strict_map(self, node: MappingNode) -> Iterator[YamlMap]:
        data = YamlMap(node.start_mark.line + 1)
        yield data
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node)
            if not isinstance(key, (str, int, bool, type(None))):
                raise ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"a key must be a plain scalar, got {show(key)}",
                    key_node.start_mark,
                )
            line = key_node.start_mark.line + 1
            if key in first:
                raise DuplicateKey(
                    None,
                    None,
                    f"duplicate key {key!r} (first on line {first[key]})",
                    key_node.start_mark,
                )
            first[key] = line
        # Merged keys (<<) come first, so the mapping's own keys win, as in YAML.
        self.flatten_mapping(node)
        for key_node, value_node in node.value:
            key = self.construct_object(key_node)
            data[key] = self.construct_object(value_node)
            data.key_lines[key] = key_node.start_mark.line + 1

    def construct_strict_seq(self, node: SequenceNode) -> Iterator[YamlList]:
        data = YamlList(node.start_mark.line + 1)
        yield data
        for child in node.value:
            data.append(self.construct_object(child))
            data.item_lines.append(child.start_mark.line + 1)

    def construct_checked_timestamp(self, node: ScalarNode) -> Any:
        try:
            return self.construct_yaml_timestamp(node)
        except (ValueError, OverflowError) as exc:
            raise ConstructorError(
                None,
                None,
                f"{node.value!r} is not a valid date ({exc}); quote it",
                node.start_mark,
            ) from None

    yaml_constructors: ClassVar[dict[str | None, Any]] = {
        **yaml.constructor.SafeConstructor.yaml_constructors,
        "tag:yaml.org,2002:map": construct_strict_map,
        "tag:yaml.org,2002:seq": construct_strict_seq,
        "tag:yaml.org,2002:timestamp": construct_checked_timestamp,
    }


class StrictLoader(
    yaml.reader.Reader,
    yaml.scanner.Scanner,
    yaml.parser.Parser,
    yaml.composer.Composer,
    _Constructor,
    _Resolver,
):
    """SafeLoader with duplicate keys refused, line numbers kept and YAML 1.2 booleans."""

    def __init__(self, stream: str) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        _Constructor.__init__(self)
        _Resolver.__init__(self)


def load(text: str, *, source: str) -> Any:
    """Parse one YAML document; any YAML error is a one-line ``PolicyError`` with its line."""
    loader: StrictLoader | None = None
    try:
        loader = StrictLoader(text)
        data = loader.get_single_data()
    except DuplicateKey as exc:
        raise PolicyError(_one_line(f"{source}:{_line(exc, text)}: {exc.problem}")) from None
    except yaml.MarkedYAMLError as exc:
        what = exc.problem or exc.context or "syntax error"
        raise PolicyError(
            _one_line(f"{source}:{_line(exc, text)}: not valid YAML: {what}")
        ) from None
    except yaml.YAMLError as exc:
        reason = getattr(exc, "reason", None) or str(exc)
        raise PolicyError(
            _one_line(f"{source}:{_line(exc, text)}: not valid YAML: {reason}")
        ) from None
    except RecursionError:
        raise PolicyError(f"{source}:1: not valid YAML: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()
    _check_shape(data, Where(source, "", getattr(data, "line", 1)), set(), {})
    return data


def _line(exc: yaml.YAMLError, text: str) -> int:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        if mark is not None:
            return int(mark.line) + 1
    position = getattr(exc, "position", None)
    if isinstance(position, int):
        return text.count("\n", 0, position) + 1
    return 1


def _check_shape(value: Any, where: Where, ancestors: set[int], sizes: dict[int, int]) -> int:
    """Refuse recursive aliases and alias bombs; return how many values ``value`` expands to."""
    if not isinstance(value, (YamlMap, YamlList)):
        return 1
    ident = id(value)
    if ident in ancestors:
        raise where.error("a recursive alias is not allowed")
    if ident in sizes:
        return sizes[ident]
    ancestors.add(ident)
    total = 1
    try:
        if isinstance(value, YamlMap):
            for key, item in value.items():
                total += _check_shape(item, where.key(value, key), ancestors, sizes)
        else:
            for i, item in enumerate(value):
                total += _check_shape(item, where.index(value, i), ancestors, sizes)
    except RecursionError:
        raise where.error("nested too deeply") from None
    ancestors.discard(ident)
    if total > MAX_NODES:
        raise where.error(f"expands to more than {MAX_NODES} values through aliases")
    sizes[ident] = total
    return total


def check_plain(value: Any, where: Where) -> None:
    """Refuse anything that is not JSON-like data without floats: str, int, bool, None,
    string-keyed mappings and lists."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, int)):
        return
    if isinstance(value, float):
        raise where.error(
            f"floats are not allowed, got {value!r}: use an integer (money in minor units, "
            "such as cents) or a quoted string"
        )
    if isinstance(value, YamlMap):
        for key, item in value.items():
            if not isinstance(key, str):
                raise where.key(value, key).error(f"key {show(key)} is not a string: quote it")
            check_plain(item, where.key(value, key))
        return
    if isinstance(value, YamlList):
        for i, item in enumerate(value):
            check_plain(item, where.index(value, i))
        return
    if isinstance(value, (datetime.date, datetime.datetime)):
        raise where.error(f"{show(value)} is not allowed")
    raise where.error(f"a value of YAML type {type(value).__name__} is not allowed")


def plain(value: Any) -> Any:
    """A loaded value as plain dicts and lists, for hashing and for frozen configuration."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def expect_map(value: Any, where: Where) -> YamlMap:
    """``value`` if it is a mapping, else a ``PolicyError`` at ``where``."""
    if not isinstance(value, YamlMap):
        raise where.error(f"must be a mapping, got {show(value)}")
    return value


def check_keys(
    mapping: YamlMap, where: Where, allowed: Iterable[str], *, required: Iterable[str] = ()
) -> None:
    """Refuse keys outside the closed set ``allowed`` and report missing ``required`` ones."""
    known = sorted(allowed)
    for key in mapping:
        if not isinstance(key, str):
            raise where.key(mapping, key).error(f"key {show(key)} is not a string: quote it")
        if key not in known:
            raise where.key(mapping, key).error(f"unknown key; expected one of {', '.join(known)}")
    for key in required:
        if key not in mapping:
            raise where.error(f"missing required key {key!r}")


def expect_str(value: Any, where: Where) -> str:
    """``value`` if it is a non-empty string."""
    if not isinstance(value, str) or not value:
        raise where.error(f"must be a non-empty string, got {show(value)}")
    return value


def expect_choice(value: Any, where: Where, choices: Iterable[str]) -> str:
    """``value`` if it is exactly one of ``choices``."""
    options = tuple(choices)
    if not isinstance(value, str) or value not in options:
        raise where.error(f"must be one of {', '.join(options)}, got {show(value)}")
    return value
