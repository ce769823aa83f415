"""Effect and resource templates: literal text with ``{name}`` placeholders."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import EffectKeyError

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_NAME = re.compile(r"[^\W\d]\w*\Z")


class TemplateSyntaxError(ValueError):
    """A template that is not literal text with ``{identifier}`` placeholders."""


@dataclass(frozen=True)
class Template:
    """A parsed template; ``names`` are its placeholders in order."""

    text: str
    names: tuple[str, ...]

    def resolve(
        self, values: Mapping[str, Any], *, resource: str | None = None, plain: bool = False
    ) -> str:
        """Fill the placeholders; each value must be a non-empty str or a non-bool int.

        ``plain``: a string that spells a number otherwise than plainly is refused too
        (``respelt_number``), as an SDK call's effect key does."""

        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if name == "resource" and name not in values:
                if resource is None:
                    raise EffectKeyError(
                        f"template {self.text!r} needs a resource, and none is set"
                    )
                return resource
            if name == "resource" and resource is not None:
                raise EffectKeyError(
                    f"template {self.text!r}: {{resource}} is ambiguous (an argument has that name)"
                )
            if name not in values:
                raise EffectKeyError(
                    f"template {self.text!r} needs {name!r}, which is not among the arguments "
                    f"({', '.join(sorted(values)) or 'none'})"
                )
            value = values[name]
            if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
                raise EffectKeyError(
                    f"template {self.text!r}: {name!r} must be a non-empty string or an integer, "
                    f"got {value!r}"
                )
            problem = _unsettled(value) if isinstance(value, str) else None
            if problem is None and plain and isinstance(value, str) and respelt_number(value):
                raise EffectKeyError(
                    f"template {self.text!r}: {name!r} is {value[:40]!r}, which spells a number "
                    "otherwise than plainly: code that reads it as a number (int(), float(), an "
                    "integer column, pydantic) acts on the number that its plain spelling, or "
                    "the integer itself, keys as another effect; pass the integer"
                )
            if problem is not None:
                raise EffectKeyError(
                    f"template {self.text!r}: {name!r} is {value!r}, which {problem}: a remote "
                    "that trims or normalizes text reads it as another spelling's effect; pass "
                    "the value as the remote keeps it"
                )
            return str(value)

        return _PLACEHOLDER.sub(one, self.text)


_PLAIN = re.compile(r"(?:0|-?[1-9][0-9]*)\Z")
_PREFIXED = re.compile(r"[+-]?0(?:[xX][0-9a-fA-F_]+|[oO][0-7_]+|[bB][01_]+)\Z")


def respelt_number(value: str) -> bool:
    """Whether ``value`` is a number to a common reader (``int``, ``float``, JavaScript's
    ``Number``) but not spelt plainly (``0``, ``7``, ``-7``): ``"01"``, ``"+1"``, ``"1.0"``,
    ``"1e0"``, ``"1_0"``, ``"0x1"``, ``"١"`` are each 1 or 10 to such code, and would key an
    effect apart from ``"1"`` and ``1`` (which key alike). The rule the proxy applies to a
    ``profile: http`` or MCP write's key values (``proxy/key_spellings.py``)."""
    if _PLAIN.match(value) or not any(char.isdigit() for char in value):
        return False  # "inf", "nan": numbers to float(), names to people
    if _PREFIXED.match(value):
        return True
    try:
        float(value)
    except ValueError:
        return False
    return True


def _unsettled(value: str) -> str | None:
    """Why ``value`` may be one value to the remote under two effect keys, or None.

    Remotes trim text, drop what does not print, and compare it normalized (NFC or NFKC:
    PRECIS identifiers, Django usernames, accent-insensitive collations), so ``"pi_1 "``,
    ``"caf\u00e9"`` spelt decomposed, or ``"pi_1\u200b"`` may be ``pi_1`` or ``café`` there:
    rendered as they are, each would name an effect key of its own and act again.
    """
    if value.isascii() and value.isprintable():
        return None if value.strip() == value else "has leading or trailing whitespace"
    if value.strip() != value:
        return "has leading or trailing whitespace"
    for char in value:
        if unicodedata.category(char)[0] == "C" or unicodedata.category(char) in ("Zl", "Zp"):
            return f"holds {unicodedata.name(char, f'U+{ord(char):04X}')} (it does not print)"
    if unicodedata.normalize("NFKC", value) != value:
        return "is not in Unicode normal form NFKC (a decomposed or compatibility spelling)"
    return None


def parse_template(text: object) -> Template:
    """Parse ``text``; raise ``TemplateSyntaxError`` with what is wrong."""
    if not isinstance(text, str) or not text:
        raise TemplateSyntaxError("a template must be a non-empty string")
    names: list[str] = []
    pos = 0
    for match in _PLACEHOLDER.finditer(text):
        literal = text[pos : match.start()]
        if "{" in literal or "}" in literal:
            raise TemplateSyntaxError(f"stray brace in template {text!r}")
        name = match.group(1)
        if not _NAME.match(name):
            raise TemplateSyntaxError(
                f"placeholder {{{name}}} in template {text!r} is not a plain identifier"
            )
        names.append(name)
        pos = match.end()
    if "{" in text[pos:] or "}" in text[pos:]:
        raise TemplateSyntaxError(f"stray brace in template {text!r}")
    return Template(text, tuple(names))
