"""Operators: the people who answer for agents, named in the policy's ``operators:`` section.

::

    operators:
      alice: {token_env: CTRLRUN_OPERATOR_ALICE}
      bob: {token_env: CTRLRUN_OPERATOR_BOB}

Every act of an operator (approve, deny, resolve, freeze, unfreeze) is recorded under a name.
The CLI takes it from ``--as NAME``, or else the OS user; when the policy lists operators, the
name must be one of them. The token (named by ``token_env``, never written in the file) is what
a console login presents.
"""

from __future__ import annotations

import getpass
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgument
from .policy_sections import Section, SectionContext
from .yamlstrict import Where, check_keys, expect_map, show

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")


@dataclass(frozen=True)
class Operator:
    """One operator: a name, and the environment variable that holds their token."""

    name: str
    token_env: str


def _parse(value: Any, where: Where, _: SectionContext) -> Mapping[str, Operator]:
    entries = expect_map(value, where)
    found: dict[str, Operator] = {}
    for name, entry in entries.items():
        at = where.key(entries, name)
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise at.error(
                f"an operator name is letters, digits and _ . @ - (at most 64), got {show(name)}"
            )
        check_keys(expect_map(entry, at), at, ("token_env",), required=("token_env",))
        env = entry["token_env"]
        if not isinstance(env, str) or not _ENV_NAME.fullmatch(env):
            raise at.key(entry, "token_env").error(
                f"must be the name of an environment variable (letters, digits, _), got {show(env)}"
            )
        found[name] = Operator(name, env)
    return found


OPERATORS: Section[Mapping[str, Operator]] = Section("operators", _parse, empty={})


def operator_name(given: str | None, operators: Mapping[str, Operator]) -> str:
    """Who is acting: ``given`` (``--as``), else the OS user; one of ``operators`` if any."""
    name = given if given is not None else _os_user()
    if not _NAME.fullmatch(name):
        raise InvalidArgument(f"--as {name!r}: an operator name is letters, digits and _ . @ -")
    if operators and name not in operators:
        known = ", ".join(sorted(operators))
        raise InvalidArgument(f"{name!r} is not an operator in the policy (operators: {known})")
    return name


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError) as exc:  # no name for this uid (a container's): say so
        raise InvalidArgument(
            "who is acting? the OS user has no name here: pass --as NAME"
        ) from exc
