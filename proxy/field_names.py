"""Field names a server may read as one field where ctrlrun reads two (``profile: http``).

ctrlrun takes the names of a write's query, form and JSON fields as sent. Common servers
fold them first:

- PHP drops the spaces a name starts with and reads ' ' and '.' in it (and a '[' that no ']'
  follows) as '_': `` amount`` is ``amount`` there, ``amount.cents`` is ``amount_cents``;
- PHP, Rack (Rails), Express's ``qs`` read ``a[b]=1`` and ``a[]=1`` as the field ``a``; Rack 2
  and ``qs`` read ``[a]=1`` (Rack 2 ``a]=1`` too) as ``a``;
- ASP.NET reads form and query names without regard to case.

Then the last (PHP, Rack) or the first (ASP.NET) of two such fields is the one the server
uses, and ``amount=5&+amount=900000`` is a charge of 900000 to PHP that ctrlrun read as 5. So
two names that one of those readings makes one field are refused. A lone folded name is read
as the other name it is (an argument the policy may then find missing), and fields nested
under one name (``item[name]``, ``item[qty]``) are fields of one object, not a conflict.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .route_values import BadInput, shown

# "item[name]", "to[]", "a[b][c]": a name and whole brackets, which servers read as nesting.
_NESTED = re.compile(r"[^\[\]]+(?:\[[^\[\]]*\])+")
_PHP_SPECIAL = re.compile(r"[ .]")
_PHP_REST = re.compile(r"[ .\[]")
_RACK2 = re.compile(r"[\[\]]*([^\[\]]*)")


def readings(name: str) -> frozenset[str]:
    """The top-level names (case folded) that servers may read ``name`` as."""
    out = {name}
    php = name.lstrip(" ")
    bracket = php.find("[")
    if bracket == -1:
        out.add(_PHP_SPECIAL.sub("_", php))
    elif "]" in php[bracket:]:
        out.add(_PHP_SPECIAL.sub("_", php[:bracket]))  # an array: the name before '['
    else:  # no ']': the '[' is read as '_', and PHP 8 reads ' ', '.', '[' after it so too
        head, rest = _PHP_SPECIAL.sub("_", php[:bracket]), php[bracket + 1 :]
        out.update({f"{head}_{rest}", f"{head}_{_PHP_REST.sub('_', rest)}"})
    rack = _RACK2.match(name)
    if rack is not None:
        out.add(rack.group(1))
    return frozenset(n.casefold() for n in out if n)


def check_names(names: Iterable[str]) -> None:
    """Refuse two of ``names`` (distinct, as sent) that a server may read as one field."""
    whole: dict[str, str] = {}  # reading -> the name it came from
    nested: dict[str, str] = {}
    for name in names:
        is_nested = _NESTED.fullmatch(name) is not None
        found = readings(name)
        for reading in found:
            other = whole.get(reading)
            if other is None and not is_nested:
                other = nested.get(reading)
            if other is not None and other != name:
                raise BadInput(
                    f"the fields {shown(other, 40)} and {shown(name, 40)} may be one field to "
                    "the server (PHP reads ' ' and '.' as '_', Rack and qs read 'a[b]' as "
                    "part of 'a', ASP.NET ignores case); send each field under one name"
                )
        for reading in found:
            (nested if is_nested else whole).setdefault(reading, name)
