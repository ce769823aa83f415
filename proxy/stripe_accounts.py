"""Which Stripe account a write acts on, whichever credential reaches it.

One connected account is reached two ways: the platform's key with ``Stripe-Account: acct_A``,
or ``acct_A``'s own secret key with no header. Both refund from ``acct_A``, so both must give
the argument ``account`` the same value, or one payment would have two effect keys and a retry
with the other credential would refund it again. A write that names no account acts on its
key's own, which only Stripe knows: ctrlrun asks once per key (``GET /v1/account``, with the
request's own ``Authorization`` and nothing else) and keeps the answer in memory under a keyed
digest of that header, never the key itself. When Stripe cannot say, the write is refused and
nothing is forwarded. Only a policy that reads ``account`` (its action's effect or resource
template names it, or a rule has a condition on it) needs it: for any other, one key's refund
and another's of the same payment are decided alike and keyed alike, and nothing is asked
(``account`` stays ``self``). A ``stripe-mcp`` tool call is asked about the same way, of the
REST API its upstream names (``api_url``), so a refund through MCP has a REST refund's key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ctrlrun.policy import Policy

from .refusals import Refusal
from .route_values import BadInput, Request
from .stripe_routes import OWN_ACCOUNT, account, check_headers

if TYPE_CHECKING:
    from .config import Upstream
    from .forward import Forwarder

log = logging.getLogger(__name__)

_ACCOUNT = re.compile(r"acct_[A-Za-z0-9]{1,64}\Z")
_REASON = "account_unresolved"


class AccountBook:
    """The account each API key acts on by itself, as Stripe said; bounded, in memory only."""

    def __init__(self, size: int = 4096) -> None:
        self._secret = os.urandom(32)  # digests mean nothing outside this process
        self._size = size
        self._known: OrderedDict[tuple[str, bytes], str] = OrderedDict()

    def digest(self, authorization: str) -> bytes:
        return hmac.new(self._secret, authorization.encode(), hashlib.sha256).digest()

    def recall(self, upstream: str, authorization: str) -> str | None:
        entry = (upstream, self.digest(authorization))
        found = self._known.get(entry)
        if found is not None:
            self._known.move_to_end(entry)
        return found

    def remember(self, upstream: str, authorization: str, account: str) -> None:
        self._known[(upstream, self.digest(authorization))] = account
        while len(self._known) > self._size:
            self._known.popitem(last=False)


def needed(policy: Policy, action: str) -> bool:
    """Whether ``action``'s key, resource or rules read ``account`` (else it is never asked)."""
    entry = policy.actions.get(action)
    if entry is None:
        return False  # an unknown action is denied whatever its account
    templates = (entry.effect, entry.resource)
    return any(t is not None and "account" in t.names for t in templates) or any(
        c.subject == "account" for rule in entry.rules for c in rule.conditions
    )


async def own_account(
    forwarder: Forwarder, up: Upstream, headers: Mapping[str, str], action: str
) -> str | Refusal:
    """The account the request's API key acts on with no ``Stripe-Account``, or why not."""
    authorization = headers.get("authorization", "")
    book = forwarder.accounts
    known = book.recall(up.name, authorization) if authorization else None
    if known is not None:
        return known
    asking = [("authorization", authorization)] if authorization else []
    reply = await forwarder.send(up, "GET", "/v1/account", asking, b"")
    if reply.status is None or reply.status >= 500 or reply.cut_short:
        return _unanswered(reply.error or f"HTTP {reply.status}", action)
    if reply.status in (401, 403):
        return Refusal(
            "invalid_request",
            _REASON,
            f"Stripe answered HTTP {reply.status} when asked which account this request's API "
            "key acts on (GET /v1/account); nothing was sent. A restricted key needs read "
            "access to the account, or name the account in Stripe-Account",
            action=action,
        )
    found = _id(reply.body) if reply.status == 200 else None
    if found is None and reply.status not in (200, 404):
        # A 429 (rate limited), a redirect, a 400: Stripe did not say, and may say later.
        # Keyed as `self` now and as the account then, one payment would have two keys.
        return _unanswered(f"HTTP {reply.status}", action)
    if found is None:
        # Stripe names every key's account (200) or refuses the key (401/403). A 404, or a
        # 200 that is no account, is a server that speaks Stripe's writes but serves no
        # GET /v1/account (a mock): a key's account cannot be learned there, ever, and a
        # write is keyed as before, `self`.
        _no_accounts(up.name, reply.status)
        found = OWN_ACCOUNT
    if authorization:
        book.remember(up.name, authorization, found)
    return found


_told: set[str] = set()


def _no_accounts(upstream: str, status: int) -> None:
    if upstream not in _told:
        _told.add(upstream)
        log.warning(
            "upstream %s answered GET /v1/account with HTTP %s, not an account: writes without "
            "Stripe-Account are keyed as account self (a connected account's own key and the "
            "platform's key with Stripe-Account then key one payment twice)",
            upstream,
            status,
        )


def api_upstream(up: Upstream) -> Upstream | None:
    """Stripe's REST API as a stripe-mcp upstream names it (``api_url``), to ask it questions."""
    if up.profile != "stripe-mcp" or up.mcp is None or not up.mcp.api_url:
        return None
    parts = urlsplit(up.mcp.api_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    url = up.mcp.api_url
    return replace(up, name=f"{up.name} api", profile="stripe", url=url, host=host, port=port,
                   scheme=parts.scheme, listen=None, mcp=None)  # fmt: skip


async def derived(
    forwarder: Forwarder, up: Upstream, request: Request, action: str | None, policy: Policy
) -> dict[str, Any] | Refusal:
    """Arguments a stripe-mcp call's headers give: the account it acts on, as for REST."""
    api = api_upstream(up)
    if api is None:
        return {}
    try:
        check_headers(request)
        named = account(request)
    except BadInput as exc:
        return Refusal("invalid_request", exc.reason, f"tool call refused: {exc.reason}")
    if named != OWN_ACCOUNT or action is None or not needed(policy, action):
        return {"account": named}
    found = await own_account(forwarder, api, request.headers, action or "-")
    return found if isinstance(found, Refusal) else {"account": found}


def _unanswered(why: str, action: str) -> Refusal:
    log.warning("account of a Stripe key unresolved: %s", why)
    return Refusal(
        "unavailable",
        _REASON,
        f"ctrlrun could not learn which account this request's API key acts on ({why}); "
        "nothing was sent",
        action=action,
    )


def _id(body: bytes) -> str | None:
    try:
        document: Any = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(document, dict) or document.get("object") != "account":
        return None
    found = document.get("id")
    return found if isinstance(found, str) and _ACCOUNT.match(found) else None
