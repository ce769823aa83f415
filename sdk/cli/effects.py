"""Effect records and settling them: ``effects``, ``resolve`` and ``reconcile``."""

from __future__ import annotations

import json
import sys

import click

from ctrlrun import checks, views
from ctrlrun.errors import EffectKeyError
from ctrlrun.states import EffectState

from .common import errors, fail, json_option, operator, operator_option, reader, say, store_option

DEFAULT_LIMIT = 100


@click.command()
@click.option(
    "--state",
    type=click.Choice([s.value for s in EffectState if s is not EffectState.NEW]),
    help="Only effects in this state.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    metavar="N",
    help=f"Only the newest N effects (default {DEFAULT_LIMIT}).",
)
@click.option("--all", "show_all", is_flag=True, help="Every effect, however many.")
@json_option
@store_option
@errors
def effects(
    state: str | None, limit: int | None, show_all: bool, as_json: bool, store_url: str | None
) -> None:
    """List effect records, newest first (the newest 100 unless told otherwise).

    \b
    Examples:
      ctrlrun effects --state ambiguous
      ctrlrun effects --all --json | jq -r .effect_key
    """
    from ctrlrun import ledger

    if show_all and limit is not None:
        raise click.UsageError("--limit and --all: choose one")
    shown = None if show_all else (limit or DEFAULT_LIMIT)
    store = reader(store_url)
    with store.reading() as conn:
        # One more than shown, to know whether the list was cut.
        records = ledger.list_effects(
            conn, EffectState(state) if state else None, None if shown is None else shown + 1
        )
        cut = shown is not None and len(records) > shown
        records = records[:shown]
        # When each ambiguous effect is asked next, so an operator sees the sweep is on it.
        ambiguous = [r.effect_key for r in records if r.state is EffectState.AMBIGUOUS]
        found = checks.schedules(conn, ambiguous) if ambiguous else {}
    if not records:
        say(f"no effects are {state}" if state else "no effects yet", as_json=as_json)
        return
    now = store.clock()
    for rec in records:
        schedule = found.get(rec.effect_key)
        click.echo(
            json.dumps(views.effect_json(rec, schedule))
            if as_json
            else views.effect_line(rec, now, schedule)
        )
    if cut:
        click.echo(f"(the newest {shown} shown; --limit N or --all for more)", err=True)


@click.command()
@click.argument("effect_key")
@click.option("--committed", is_flag=True, help="The remote did it.")
@click.option("--failed", is_flag=True, help="The remote did not; a retry is permitted.")
@click.option(
    "--note",
    metavar="TEXT",
    help="What you checked (kept on the record, shown by `ctrlrun receipts` and `inspect`).",
)
@operator_option
@store_option
@errors
def resolve(
    effect_key: str,
    committed: bool,
    failed: bool,
    note: str | None,
    as_name: str | None,
    store_url: str | None,
) -> None:
    """Settle an AMBIGUOUS effect by hand, after checking the remote.

    \b
    Examples:
      ctrlrun resolve refund:pi_123 --committed --note "re_9 in the dashboard"
      ctrlrun resolve refund:pi_123 --failed      # it does not exist; a retry may run
    """
    if committed == failed:  # neither, or both: a typo must never license a retry
        raise click.UsageError("say what happened: --committed or --failed (exactly one)")
    if note is not None and not note.strip():
        raise click.UsageError("--note is empty: say what you checked, or leave it out")
    state = "committed" if committed else "failed"
    from ctrlrun.reconcile import Reconciler

    who = operator(as_name)
    store = reader(store_url)
    try:
        Reconciler(store, store.clock).resolve(
            effect_key, state, resolved_by=who, note=None if note is None else note.strip()
        )
    except EffectKeyError as exc:
        fail(str(exc), 1)
    click.echo(f"{effect_key} resolved {state} by {who}")
    if state == "failed":
        click.echo("a retry of this effect is now permitted")


@click.command()
@click.argument("effect_key", required=False)
@click.option(
    "--policy",
    "policy_file",
    metavar="FILE",
    help="Policy file with the upstreams (default: $CTRLRUN_CONFIG or ./ctrlrun.yaml).",
)
@store_option
@errors
def reconcile(effect_key: str | None, policy_file: str | None, store_url: str | None) -> None:
    """Ask the remote now what happened to one ambiguous effect, or to all of them.

    \b
    Examples:
      ctrlrun reconcile refund:pi_123
      ctrlrun reconcile               # every ambiguous effect with a reconciler
    """
    # The reconcilers are the proxy's upstreams': only this command needs them.
    from ctrlrun.control import Control
    from ctrlrun.proxy import registry
    from ctrlrun.proxy.config_parse import load_policy, proxy_config
    from ctrlrun.reconcilers.sweep import sweep

    policy = load_policy(policy_file)
    store = reader(store_url, policy_file)
    results = sweep(
        Control(policy, store),
        registry.build(proxy_config(policy).upstreams),
        keys=[effect_key] if effect_key else None,
        ask_now=True,
    )
    if not results:
        click.echo(
            f"{effect_key}: nothing to reconcile"
            if effect_key
            else "no ambiguous effects to reconcile"
        )
        if effect_key:
            sys.exit(1)
        return
    for key, answer in results:
        click.echo(f"{key}  {answer}")
