"""Call context: who is asking, which approval is presented, the attempt's idempotency token."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from .action import Principal, canonical_bytes
from .errors import InvalidArgument

_principal: ContextVar[Principal | None] = ContextVar("ctrlrun_principal", default=None)
_approval: ContextVar[str | None] = ContextVar("ctrlrun_approval", default=None)
# (effect key, attempt) of the attempt executing here; the token is derived only when asked.
_token: ContextVar[tuple[str, int] | None] = ContextVar("ctrlrun_token", default=None)


@contextmanager
def context(agent: str, user: str | None = None) -> Iterator[Principal]:
    """Bind the principal (agent, and the user it acts for) to protected calls in the block."""
    principal = Principal(agent, user)
    reset = _principal.set(principal)
    try:
        yield principal
    finally:
        _principal.reset(reset)


@contextmanager
def with_approval(request_id: str) -> Iterator[None]:
    """Present an approval to protected calls in the block; it must still match the action."""
    if not isinstance(request_id, str) or not request_id:
        raise InvalidArgument("with_approval needs a non-empty approval request id")
    reset = _approval.set(request_id)
    try:
        yield
    finally:
        _approval.reset(reset)


def current_principal() -> Principal | None:
    return _principal.get()


def presented_approval() -> str | None:
    return _approval.get()


def idempotency_token_for(effect_key: str, attempt: int) -> str:
    """A deterministic UUID-shaped token for one attempt on one effect key."""
    if not isinstance(effect_key, str) or not effect_key:
        raise InvalidArgument("effect key must be a non-empty string")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise InvalidArgument("attempt must be an integer >= 1")
    digest = bytearray(
        hashlib.sha256(
            canonical_bytes(
                {"schema": "ctrlrun.idempotency/v1", "effect_key": effect_key, "attempt": attempt}
            )
        ).digest()[:16]
    )
    digest[6] = (digest[6] & 0x0F) | 0x80
    digest[8] = (digest[8] & 0x3F) | 0x80
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def idempotency_token() -> str:
    """The current attempt's token; only inside a protected executor holding its effect key."""
    held = _token.get()
    if held is None:
        raise InvalidArgument(
            "idempotency_token() is only available inside a protected function with an effect key"
        )
    return idempotency_token_for(*held)


class attempt_token:
    """Make ``idempotency_token()`` answer for this attempt inside the block.

    A class, not a ``@contextmanager``: it is entered on every protected call."""

    __slots__ = ("held", "reset")

    def __init__(self, held: tuple[str, int] | None) -> None:
        self.held = held

    def __enter__(self) -> None:
        self.reset = _token.set(self.held)

    def __exit__(self, *exc: object) -> None:
        _token.reset(self.reset)
