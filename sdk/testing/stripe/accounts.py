"""Connect for the fake: the platform's own account and the connected accounts it acts on.

A request acts on the account its ``Stripe-Account`` header names, else on the platform's.
Each account holds its own objects and its own idempotency keys (Stripe scopes a key to the
account it acted on), so a key used on ``acct_A`` means nothing on ``acct_B``. A header naming
an account the platform has not connected is refused before anything is looked up or stored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..messages import Request
from .idempotency import Idempotency
from .routes import Routes
from .state import StripeState
from .wire import StripeError, new_id

PLATFORM = ""  # the key under which the platform's own account is kept


@dataclass(frozen=True)
class Account:
    """One Stripe account: its objects, its stored idempotent answers, its endpoints."""

    state: StripeState
    idempotency: Idempotency
    routes: Routes


class Accounts:
    """The platform and its connected accounts; the caller holds the fake's lock."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._by_id: dict[str, Account] = {}
        self.add(PLATFORM)

    def add(self, account_id: str | None = None) -> str:
        """Connect an account (a new ``acct_`` id unless given); returns its id."""
        account_id = new_id("acct_") if account_id is None else account_id
        if account_id in self._by_id:
            raise ValueError(f"account {account_id!r} already exists")
        state = StripeState(self._clock)
        self._by_id[account_id] = Account(state, Idempotency(self._clock), Routes(state))
        return account_id

    def get(self, account_id: str | None) -> Account:
        """The account seeded or inspected by a test (``None``: the platform's)."""
        found = self._by_id.get(account_id or PLATFORM)
        if found is None:
            raise KeyError(f"no account {account_id!r}; add it with add_account()")
        return found

    def of(self, request: Request) -> Account:
        """The account ``request`` acts on; ``StripeError`` 403 for one not connected."""
        named = request.header("stripe-account").strip()
        found = self._by_id.get(named) if named else self._by_id[PLATFORM]
        if found is None:
            raise StripeError(
                403,
                f"The provided key does not have access to account '{named}' (or that account "
                "does not exist). Application access may have been revoked.",
                error_type="invalid_request_error",
                code="account_invalid",
            )
        return found
