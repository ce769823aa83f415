"""Connect for the fake: the platform's own account and the connected accounts it acts on.

A request acts on the account its ``Stripe-Account`` header names, else on its key's own
account: the platform's for any ``sk_test_`` key, or a connected account's for a key that
account was given (``add_account(key=…)``). Naming the key's own account is the same as naming
none. Each account holds its own objects and its own idempotency keys (Stripe scopes a key to
the account it acted on), so a key used on ``acct_A`` means nothing on ``acct_B``. A header
naming an account the key may not act on (one the platform has not connected, or any other
account for a connected account's own key) is refused before anything is looked up or stored.
"""

from __future__ import annotations

import base64
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
    """One Stripe account: its id, its objects, its stored idempotent answers, its endpoints."""

    id: str
    state: StripeState
    idempotency: Idempotency
    routes: Routes


class Accounts:
    """The platform and its connected accounts; the caller holds the fake's lock."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._by_id: dict[str, Account] = {}
        self._own: dict[str, str] = {}  # a connected account's own secret key -> its id
        self.platform_id = new_id("acct_")
        self.add(PLATFORM)

    def add(self, account_id: str | None = None, *, key: str | None = None) -> str:
        """Connect an account (a new ``acct_`` id unless given); returns its id."""
        account_id = new_id("acct_") if account_id is None else account_id
        if account_id in self._by_id or (account_id and account_id == self.platform_id):
            raise ValueError(f"account {account_id!r} already exists")
        if key is not None:
            if key in self._own:
                raise ValueError("that key already belongs to an account")
            self._own[key] = account_id
        state = StripeState(self._clock)
        shown = account_id or self.platform_id
        self._by_id[account_id] = Account(shown, state, Idempotency(self._clock), Routes(state))
        return account_id

    def get(self, account_id: str | None) -> Account:
        """The account seeded or inspected by a test (``None``: the platform's)."""
        if account_id == self.platform_id:
            account_id = PLATFORM
        found = self._by_id.get(account_id or PLATFORM)
        if found is None:
            raise KeyError(f"no account {account_id!r}; add it with add_account()")
        return found

    def of(self, request: Request) -> Account:
        """The account ``request`` acts on; ``StripeError`` 403 for one it may not."""
        own = self._own.get(api_key(request), PLATFORM)
        named = request.header("stripe-account").strip()
        if not named or named == self._by_id[own].id:
            return self._by_id[own]
        found = self._by_id.get(named) if own == PLATFORM else None
        if found is None:
            raise StripeError(
                403,
                f"The provided key does not have access to account '{named}' (or that account "
                "does not exist). Application access may have been revoked.",
                error_type="invalid_request_error",
                code="account_invalid",
            )
        return found


def api_key(request: Request) -> str:
    """The secret key of ``request``: Bearer, or Basic with the key as the user ('' if none)."""
    scheme, _, credential = request.header("authorization").partition(" ")
    if scheme.lower() == "basic":
        try:
            return base64.b64decode(credential).decode().partition(":")[0].strip()
        except ValueError:
            return ""
    return credential.strip() if scheme.lower() == "bearer" else ""
