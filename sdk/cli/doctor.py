"""``ctrlrun doctor``: check a ledger's integrity and identity, and say what to do."""

from __future__ import annotations

import json

import click

from ctrlrun.config import store_url as resolve_store_url

from .common import errors, fail, json_option, store_option

# What --accept may settle: the ledger is whole, only its identity or a past loss is in doubt.
ACCEPTABLE = {"identity", "in use"}


@click.command()
@store_option
@click.option("--policy", "policy_file", metavar="FILE", help="Policy beside the default ledger.")
@click.option(
    "--accept",
    is_flag=True,
    help="Trust this SQLite ledger as it is now (after restoring it): clears a loss noted "
    "while in use, and a mismatch with the identity recorded at creation.",
)
@json_option
@errors
def doctor(store_url: str | None, policy_file: str | None, accept: bool, as_json: bool) -> None:
    """Check the ledger: the file, PRAGMA integrity_check, its identity, the receipt chain.

    \b
    Examples:
      ctrlrun doctor
      ctrlrun doctor --store-url sqlite:///.ctrlrun/state.db --accept
    Exit 0 when every check holds, 1 when one does not (each says what to do).
    """
    from ctrlrun.doctor import accept as accept_ledger
    from ctrlrun.doctor import diagnose

    url = resolve_store_url(store_url, policy_file)
    findings = diagnose(url)
    for f in findings:
        if as_json:
            click.echo(json.dumps({"check": f.check, "ok": f.ok, "detail": f.detail, "fix": f.fix}))
        else:
            click.echo(f"{'ok  ' if f.ok else 'FAIL'}  {f.check}: {f.detail}")
            if f.fix:
                click.echo(f"      what to do: {f.fix}")
    failing = {f.check for f in findings if not f.ok}
    if accept:
        if failing - ACCEPTABLE:
            fail(f"not accepted: fix {', '.join(sorted(failing - ACCEPTABLE))} first", 1)
        click.echo(accept_ledger(url))
        return
    if failing:
        fail(f"{len(failing)} check(s) failed: {', '.join(sorted(failing))}", 1)
