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
that record as on any other (a duplicate, ambiguous, a renewal after a failure). The same
holds for a refund named by its charge, keyed by that charge before ctrlrun resolved a charge
to its payment intent (``stripe_payments``): ``refund:self:ch_1`` is ``refund:acct_A:pi_1``.
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


def older_spellings(template: Template | None, p: Prepared) -> list[str]:
    """The keys ``p``'s action had before: its account spelt ``self``, its payment spelt by
    the charge it named (before a charge was resolved to its payment intent), or both."""
    args = p.action.arguments
    if template is None or p.effect_key is None:
        return []
    accounts = [args.get("account")]
    if "account" in template.names and accounts[0] not in (None, OWN_ACCOUNT):
        accounts.append(OWN_ACCOUNT)
    payments = [args.get("payment_id")]
    charge = args.get("charge")
    if "payment_id" in template.names and isinstance(charge, str) and charge != payments[0]:
        payments.append(charge)
    found: list[str] = []
    for account in accounts:
        for payment in payments:
            try:
                spelt = {**args, "account": account, "payment_id": payment}
                key = template.resolve(spelt, resource=p.action.resource)
            except EffectKeyError:
                continue
            if key != p.effect_key and key not in found:
                found.append(key)
    return found


def chosen(
    new: Mapping[str, Any] | None, olds: list[tuple[str, Mapping[str, Any] | None]]
) -> str | None:
    """The older key whose record is the effect's, beside ``new``'s record; None: ``new``."""
    if new is not None and _stands(new):
        return None
    # Both exist only where an earlier ctrlrun keyed the payment both ways: the one that
    # still stands (committed, running, ambiguous) holds, so no failed one lets a retry by.
    standing = [key for key, row in olds if row is not None and _stands(row)]
    if standing:
        return standing[0]
    if new is not None:
        return None
    failed = [key for key, row in olds if row is not None]
    return failed[0] if failed else None  # renewed under the key it has


def _stands(row: Mapping[str, Any]) -> bool:
    return str(row["state"]) != EffectState.FAILED.value


async def as_recorded(
    ctl: Control, up: Upstream, p: Prepared, template: Template | None
) -> Prepared | Refusal:
    """``p`` under the key its effect is recorded under (see the module docstring)."""
    olds = older_spellings(template, p) if up.profile in _PROFILES else []
    if not olds:
        return p
    new = p.effect_key
    assert new is not None

    def rows() -> tuple[Mapping[str, Any] | None, list[tuple[str, Mapping[str, Any] | None]]]:
        # Read in a write transaction: in a batch it sees the decisions before it.
        def read(conn: Any) -> Any:
            return ledger.get_effect_row(conn, new), [
                (key, ledger.get_effect_row(conn, key)) for key in olds
            ]

        return ctl.store.write(read)  # type: ignore[no-any-return]

    try:
        found_new, found_olds = await decide(ctl.store, rows)
    except Exception as exc:  # the ledger could not say: refused, nothing forwarded
        return refusal_for(exc, action=p.action.name, effect_key=new)
    old = chosen(found_new, found_olds)
    return p if old is None else replace(p, effect_key=old)
