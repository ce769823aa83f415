"""Actions: what an agent asks to do, in canonical form, with a hash that names it."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from .clocks import utc_now as wall_now
from .errors import InvalidArgument

ACTION_SCHEMA = "ctrlrun.action/v1"


def new_id(prefix: str) -> str:
    """A fresh identifier such as ``act_`` + 32 hex digits.

    The first 12 digits are the time in milliseconds, the rest random: ids written together
    sit together in the ledger's indexes, so a large ledger costs about what a small one does.
    """
    return f"{prefix}_{time.time_ns() // 1_000_000:012x}{secrets.token_hex(10)}"


def utc_now() -> datetime:
    """This host's wall clock (``ctrlrun.clocks``)."""
    return wall_now()


def iso(ts: datetime) -> str:
    """UTC ISO-8601 with milliseconds and ``Z``."""
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"


def parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def check_value(value: Any, where: str) -> Any:
    """Return ``value`` as plain JSON data, or raise ``InvalidArgument`` naming where it failed."""
    if value is None or isinstance(value, (str, bool, int)):
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidArgument(f"string at {where} is not valid UTF-8") from None
            if type(value) is not str:
                # An enum member or another subclass: its str() (an effect key's text) may
                # not be its value (what the function and the remote get), so keep the value.
                return str.__str__(value)
        elif type(value) not in (bool, int) and value is not None:
            return int.__int__(value)
        return value
    if isinstance(value, float):
        raise InvalidArgument(
            f"float is not an allowed argument type at {where}: use integer minor units "
            "(cents) or a string"
        )
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidArgument(f"mapping key {k!r} at {where} is not a string")
            out[k] = check_value(v, f"{where}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [check_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise InvalidArgument(
        f"{type(value).__name__} is not an allowed argument type at {where}: "
        "use str, int, bool, None, lists and string-keyed mappings"
    )


def canonical_bytes(document: Mapping[str, Any], *, checked: bool = False) -> bytes:
    """The one canonical JSON encoding: sorted keys, no spaces, UTF-8, no floats.

    ``checked=True`` skips the walk that refuses non-JSON values, for documents built only
    from values that were checked already (a receipt around an action's arguments).
    """
    if not checked:
        check_value(document, "document")
    return json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who is asking: the agent, and the user it acts for."""

    agent: str
    user: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.agent, str) or not self.agent:
            raise InvalidArgument("principal agent must be a non-empty string")
        if self.user is not None and (not isinstance(self.user, str) or not self.user):
            raise InvalidArgument("principal user must be a non-empty string or None")

    def to_dict(self) -> dict[str, str | None]:
        return {"agent": self.agent, "user": self.user}


@dataclass(frozen=True)
class Action:
    """One proposed action: a name, canonical arguments, a principal and a resource."""

    name: str
    arguments: Mapping[str, Any]
    principal: Principal
    resource: str | None = None
    environment: str = "production"
    action_id: str = field(default_factory=lambda: new_id("act"))

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgument("action name must be a non-empty string")
        if self.resource is not None and (not isinstance(self.resource, str) or not self.resource):
            raise InvalidArgument("resource must be a non-empty string or None")
        plain = check_value(dict(self.arguments), "arguments")
        object.__setattr__(self, "arguments", plain)

    def canonical_document(self) -> dict[str, Any]:
        return {
            "arguments": self.arguments,
            "environment": self.environment,
            "name": self.name,
            "principal": self.principal.to_dict(),
            "resource": self.resource,
            "schema": ACTION_SCHEMA,
        }

    @cached_property
    def canonical(self) -> bytes:
        return canonical_bytes(self.canonical_document(), checked=True)

    @cached_property
    def hash(self) -> str:
        return sha256(self.canonical)

    @property
    def canonical_arguments(self) -> dict[str, Any]:
        """A fresh plain copy of the arguments, parsed back from canonical JSON."""
        result: dict[str, Any] = json.loads(canonical_bytes(self.arguments, checked=True))
        return result


def canonicalize(action: Action) -> bytes:
    return action.canonical


def action_hash(action: Action) -> str:
    return action.hash
