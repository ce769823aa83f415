"""The kill switch: ``freeze``, ``unfreeze`` and ``freezes``."""

from __future__ import annotations

import click

from .common import errors, json_option, operator, operator_option, reader, say, store_option

_ACTION = click.option(
    "--action", "action", metavar="NAME", help="Only this action (default: every action)."
)


@click.command()
@_ACTION
@click.option("--reason", required=True, metavar="TEXT", help="Why: shown to every agent refused.")
@operator_option
@store_option
@errors
def freeze(action: str | None, reason: str, as_name: str | None, store_url: str | None) -> None:
    """Stop protected writes now, on every sidecar and SDK process on this ledger.

    Within a second, every protected write of the frozen actions is refused with outcome
    `frozen` and the reason; reads flow, and nothing else changes. Lift it with `unfreeze`.

    \b
    Examples:
      ctrlrun freeze --reason "refund loop, INC-412"
      ctrlrun freeze --action stripe.refund --reason "refund loop" --as alice
    """
    from ctrlrun import freeze as switch

    who = operator(as_name)
    store = reader(store_url)
    with store.transaction() as conn:
        row, receipt = switch.freeze(
            conn, action or switch.ALL, reason=reason, by=who, now=store.clock()
        )
    click.echo(f"frozen: {row.message}  (receipt {receipt.receipt_id})")
    if action and action not in _policy_actions(action):
        click.echo(
            f"note: the policy has no action {action!r}; if that is a typo, nothing is frozen: "
            f"ctrlrun unfreeze --action {action}, then freeze the right name",
            err=True,
        )


def _policy_actions(action: str) -> frozenset[str]:
    """The actions of the policy here ($CTRLRUN_CONFIG or ./ctrlrun.yaml); with none here,
    ``{action}`` (nothing to compare with: other processes may run other policies)."""
    from ctrlrun.config import policy_path
    from ctrlrun.policy import Policy

    path = policy_path(None)
    return frozenset(Policy.from_file(path).actions) if path.is_file() else frozenset({action})


@click.command()
@_ACTION
@operator_option
@store_option
@errors
def unfreeze(action: str | None, as_name: str | None, store_url: str | None) -> None:
    """Lift a freeze (of every action, or of --action NAME).

    \b
    Examples:
      ctrlrun unfreeze
      ctrlrun unfreeze --action stripe.refund --as alice
    """
    from ctrlrun import freeze as switch

    who = operator(as_name)
    scope = action or switch.ALL
    store = reader(store_url)
    with store.transaction() as conn:
        receipt = switch.unfreeze(conn, scope, by=who, now=store.clock())
        left = switch.list_freezes(conn)
    what = "every action" if scope == switch.ALL else scope
    if receipt is None:
        click.echo(f"{what} was not frozen; nothing changed")
    else:
        click.echo(f"unfrozen: {what} by {who}  (receipt {receipt.receipt_id})")
    for row in left:
        click.echo(f"still frozen: {row.message}")


@click.command()
@json_option
@store_option
@errors
def freezes(as_json: bool, store_url: str | None) -> None:
    """List what is frozen, by whom and why.

    Example: ctrlrun freezes --json
    """
    import json

    from ctrlrun import freeze as switch

    store = reader(store_url)
    with store.reading() as conn:
        rows = switch.list_freezes(conn)
    if not rows:
        say("nothing is frozen", as_json=as_json)
    for row in rows:
        click.echo(json.dumps(row.__dict__) if as_json else f"{row.frozen_at}  {row.message}")
