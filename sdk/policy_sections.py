"""Top-level policy sections that the room owning them parses, not the policy loader.

One file, ``ctrlrun.yaml``, carries the policy and the configuration of the rooms around the
kernel (the proxy's ``upstreams:`` and ``agents:``). The loader knows the name of every
top-level key of the file format (``policy.TOP_KEYS``), so a misspelt key is an error in every
process, but it parses only its own. A room hands the loader the sections it owns::

    policy = Policy.from_file(path, sections=(UPSTREAMS, AGENTS))
    upstreams = policy.section(UPSTREAMS)      # the parsed, frozen value

A section the loader is not given stays plain data, checked for YAML hygiene only: an SDK
process reading a file that also configures the proxy loads it, and the section remains the
proxy's business. Adding a section: its name in ``TOP_KEYS``, its ``Section`` where it is
parsed (and in ``policy.KERNEL_SECTIONS`` when the kernel itself reads it from every file).

Why handed over at each load, not registered in a table when the proxy is imported: the same
``Policy.from_file(path)`` would then validate ``upstreams:`` or not depending on which modules
some other code had imported first; handed over, what a load checks is in the call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .yamlstrict import Where

T = TypeVar("T")


@dataclass(frozen=True)
class SectionContext:
    """What a section's parser may consult: the file's schema and its actions' names."""

    schema: str
    actions: frozenset[str]


@dataclass(frozen=True, eq=False)
class Section(Generic[T]):
    """A top-level policy section: its key, its parser and its value when the file has none.

    ``parse(value, where, context)`` gets the YAML node as loaded (``yamlstrict`` maps and
    lists, which remember their lines) and raises ``where.error(...)`` on bad content.
    """

    name: str
    parse: Callable[[Any, Where, SectionContext], T]
    empty: T

    def __repr__(self) -> str:
        return f"Section({self.name!r})"
