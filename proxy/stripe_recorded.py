"""One account, one key: an effect recorded when a write's own account was spelt ``self``.

Before ctrlrun learned a key's own account (``stripe_accounts``), a Stripe write without
``Stripe-Account`` had ``account: self``, so ``refund:{account}:{payment_id}`` recorded
``refund:self:pi_1``; the same refund now is ``refund:acct_A:pi_1``. Left alone, an upgrade
would let a retry of an ambiguous (or a committed) refund through under its new key: a second
refund. So where the effect key names the account, a write on ``acct_…`` is held to the
record its ``self`` spelling left, if there is one that still stands. Which account that
record's key acted on is not known (the platform's, or a connected account's own key), and a
payment lives on one account only: so whichever account the write names, the payment's
``self`` record is its record. Nothing but the choice of key changes: the kernel decides on
that record as on any other (a duplicate, ambiguous, a renewal after a failure).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ctrlrun import ledger
from ctrlrun.control import Control
from ctrlrun.decisions import decide
from ctrlrun.errors import EffectKeyError
from ctrlrun.states import EffectState
from ctrlrun.templates import Template

from .config import Upstream
from .prepare import Prepared
from .refusals import Refusal, refusal_for
from .stripe_routes import OWN_ACCOUNT

_PROFILES = ("stripe", "stripe-mcp")


def self_spelling(template: Template | None, p: Prepared) -> str | None:
    """The key ``p``'s action had with its account spelt ``self``, when that is another key."""
    account = p.action.arguments.get("account")
    if template is None or p.effect_key is None or "account" not in template.names:
        return None
    if not isinstance(account, str) or account == OWN_ACCOUNT:
        return None
    try:
        old = template.resolve(
            {**p.action.arguments, "account": OWN_ACCOUNT}, resource=p.action.resource
        )
    except EffectKeyError:
        return None
    return None if old == p.effect_key else old


def chosen(new: Mapping[str, Any] | None, old: Mapping[str, Any] | None) -> bool:
    """Whether the ``self`` record (``old``) is the effect's record, beside ``new``'s."""
    if old is None:
        return False
    # Both exist only where an earlier ctrlrun keyed the payment both ways: the one that
    # still stands (committed, running, ambiguous) holds, so no failed one lets a retry by.
    return new is None or str(old["state"]) != EffectState.FAILED.value


async def as_recorded(
    ctl: Control, up: Upstream, p: Prepared, template: Template | None
) -> Prepared | Refusal:
    """``p`` under the key its effect is recorded under (see the module docstring)."""
    if up.profile not in _PROFILES:
        return p
    old = self_spelling(template, p)
    if old is None:
        return p
    new = p.effect_key
    assert new is not None

    def rows() -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]:
        # Read in a write transaction: in a batch it sees the decisions before it.
        return ctl.store.write(
            lambda conn: (ledger.get_effect_row(conn, new), ledger.get_effect_row(conn, old))
        )

    try:
        found_new, found_old = await decide(ctl.store, rows)
    except Exception as exc:  # the ledger could not say: refused, nothing forwarded
        return refusal_for(exc, action=p.action.name, effect_key=new)
    return replace(p, effect_key=old) if chosen(found_new, found_old) else p
