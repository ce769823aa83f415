"""``ctrlrun budgets``: what each action's ``budget:`` has left in the current window."""

from __future__ import annotations

import json

import click

from .common import errors, json_option, reader, say, store_option


@click.command()
@click.option(
    "--policy",
    "policy_file",
    metavar="PATH",
    help="The policy (default: $CTRLRUN_CONFIG, else ./ctrlrun.yaml).",
)
@json_option
@store_option
@errors
def budgets(policy_file: str | None, as_json: bool, store_url: str | None) -> None:
    """Show what each budget has spent and has left in its current window.

    One line per scope that has spent something (an agent, a user, or `*` for everyone);
    a budget nobody has touched in this window shows its whole limit left. Each line says
    what happens past the limit (`over:`): refused, or an operator is asked (and a granted
    request spends past it, so `spent` may exceed the limit).

    \b
    Examples:
      ctrlrun budgets
      ctrlrun budgets --policy ctrlrun.yaml --json
    """
    from ctrlrun import budgets as ledger_budgets
    from ctrlrun.action import iso
    from ctrlrun.config import policy_path
    from ctrlrun.policy import Policy

    path = policy_path(policy_file)
    policy = Policy.from_file(path)
    store = reader(store_url, str(path))
    now = store.clock()
    found = False
    for name in sorted(policy.actions):
        budget = policy.budget(name)
        if budget is None:
            continue
        found = True
        start = iso(budget.window_start(now))
        with store.transaction() as conn:
            spent = ledger_budgets.spent_rows(conn, name, start)
        base = {"action": name, "budget": budget.describe(), "window_start": start}
        base["over"] = budget.over  # past the limit: refuse, or ask an operator
        past = "past it: refused" if budget.over == "refuse" else "past it: an operator is asked"
        for scope, used in list(spent.items()) or [("(none yet)", 0)]:
            row = {**base, "scope": scope, "spent": used, "left": max(budget.max - used, 0)}
            if as_json:
                click.echo(json.dumps(row, sort_keys=True))
            else:
                click.echo(
                    f"{name}  {scope}  spent {used}, left {row['left']} of {budget.max}  "
                    f"({budget.describe()}, {past}; window from {start})"
                )
    if not found:
        say(f"no action in {path} has a budget:", as_json=as_json)
