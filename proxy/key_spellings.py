"""Effect-key values that a server reads as another value (``profile: http``).

An effect key is made of argument text as sent, but a route's server reads an id through its
own types: Rails' ``Order.find("007")``, Django's ``get(pk="007")``, Express's ``Number()``
and MySQL's string-to-integer comparison all find order 7, as they do for ``+7``, `` 7``,
``7.0``, ``7e0``, ``0x7`` (``Number``), ``7_0`` and ``٧`` (Python's ``int``). So
``/v1/orders/007/refund`` would be a second refund of order 7 under the fresh effect key
``refund:007``. And servers strip the spaces around a parameter (MySQL's PAD SPACE
collations compare ``'o1 '`` equal to ``'o1'``), so ``o1 `` is ``o1`` there.

ctrlrun cannot know the server's types, so a value the effect key is made of is refused when
it spells a number otherwise than plainly (``0``, ``7``, ``-7``), or starts or ends with
white space: one value, one spelling, one key. Integers and other ids pass as they are.

An MCP tool's arguments are JSON, but a server built on FastMCP (pydantic in lax mode) reads
them through the tool's parameter types all the same: ``"042"``, ``"+42"``, ``"42.0"`` and
``"4_2"`` are the integer 42 to an ``int`` parameter, and ``"yes"``, ``"on"``, ``"t"`` and
``"TRUE"`` are ``True`` to a ``bool`` one, as ``"true"`` is. The same rule holds for a tool
call's effect-key values, and with ``flags`` the words a lax server reads as a boolean (other
than ``0`` and ``1``, which are plain integers) are refused too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from .refusals import Refusal

_PLAIN = re.compile(r"(?:0|-?[1-9][0-9]*)\Z")
# 0x1f, 0o17, 0b11: JavaScript's Number() and Python's int(text, 0) read them as numbers; a
# hex id that merely starts "0b" ("0b1c3e") is not one.
# pydantic's lax bool (and Rails', Go's strconv.ParseBool): each a flag, whatever its case.
_FLAGS = frozenset(("true", "false", "yes", "no", "on", "off", "t", "f", "y", "n"))
_PREFIXED = re.compile(r"[+-]?0(?:[xX][0-9a-fA-F_]+|[oO][0-7_]+|[bB][01_]+)\Z")


def _numeric(text: str) -> bool:
    """Whether some common reader (Python's int/float, JavaScript's Number) reads a number."""
    if not any(char.isdigit() for char in text):
        return False  # "inf", "nan", "Infinity": numbers to float, names to an operator
    if _PREFIXED.match(text.strip()):
        return True
    try:
        float(text)
    except ValueError:
        return False
    return True


def respelt(
    names: Iterable[str], arguments: Mapping[str, Any], *, flags: bool = False
) -> str | None:
    """Why a value the effect key takes from ``arguments`` may be another to the server."""
    for name in names:
        value = arguments.get(name)
        if not isinstance(value, str):
            continue
        if value != value.strip():
            return f"{name} {value!r} starts or ends with white space, which servers strip"
        if _numeric(value) and not _PLAIN.match(value):
            return (
                f"{name} {value[:40]!r} spells a number otherwise than plainly, and a server "
                "reading it as a number reads another spelling of the same one"
            )
        if flags and value.casefold() in _FLAGS:
            return (
                f"{name} {value!r} is a word a server reads as a boolean, under another "
                "effect key than its other spellings"
            )
    return None


def refuse_respelt(
    names: Iterable[str], arguments: Mapping[str, Any], action: str, *, flags: bool = False
) -> Refusal | None:
    """The refusal of a write whose effect-key value may be another to the server."""
    why = respelt(names, arguments, flags=flags)
    if why is None:
        return None
    return Refusal(
        "invalid_request",
        "key_spelling",
        f"{why}: the effect key would differ from the one of the same write spelt plainly; "
        "send it as the server stores it",
        action=action,
    )
