"""The ``ctrlrun`` command: a thin shell over the library.

Exit codes: 0 ok, 1 refused or not found, 2 usage or configuration (a bad flag, a bad policy,
an unreachable store).
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from . import views
from .action import utc_now
from .config import open_default_store
from .errors import (
    ApprovalMismatch,
    CTRLRunError,
    EffectKeyError,
    InvalidArgument,
    MissingDependency,
    PolicyError,
    StoreError,
)
from .states import EffectState
from .store import NoLedger, StateStore

F = TypeVar("F", bound=Callable[..., Any])
STORE_HELP = (
    "Ledger URL (sqlite:///PATH or postgresql://…). Default: $CTRLRUN_STORE_URL, "
    "$CTRLRUN_STATE, or .ctrlrun/state.db beside the policy."
)


def fail(message: str, code: int) -> NoReturn:
    click.echo(f"ctrlrun: {message}", err=True)
    sys.exit(code)


def errors(fn: F) -> F:
    """Turn expected errors into one line on stderr and the right exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (PolicyError, InvalidArgument, StoreError, MissingDependency) as exc:
            fail(str(exc), 2)
        except CTRLRunError as exc:
            fail(str(exc), 1)

    return wrapper  # type: ignore[return-value]


def reader(store_url: str | None, policy_file: str | None = None) -> StateStore:
    """Open an existing ledger; never create one."""
    try:
        return open_default_store(store_url, policy_file, create=False)
    except NoLedger as exc:
        fail(f"{exc} (set --store-url or $CTRLRUN_STORE_URL, or run where ctrlrun.yaml is)", 1)


store_option = click.option("--store-url", metavar="URL", help=STORE_HELP)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="ctrlrun")
def main() -> None:
    """ctrlrun: an agent's consequential actions at most once, as policy allows, with a receipt.

    \b
    Start here:
      ctrlrun demo                       see it work against fake Stripe and Kubernetes
      ctrlrun init                       write a starter ctrlrun.yaml
      ctrlrun proxy --policy ctrlrun.yaml   run the sidecar proxy
      ctrlrun receipts                   read what happened
    """


@main.command()
@click.option("--force", is_flag=True, help="Overwrite an existing ctrlrun.yaml.")
@errors
def init(force: bool) -> None:
    """Write a starter ctrlrun.yaml (policy + upstreams) in the current directory.

    Example: ctrlrun init && ctrlrun policy check ctrlrun.yaml
    """
    from .starter import STARTER_POLICY

    path = Path("ctrlrun.yaml")
    if path.exists() and not force:
        fail(f"{path} already exists; use --force to overwrite it", 1)
    path.write_text(STARTER_POLICY, encoding="utf-8")
    state = Path(".ctrlrun")
    state.mkdir(exist_ok=True)
    click.echo(f"wrote {path}")
    click.echo(f"created {state}/")


@main.command()
@click.option("--last", type=click.IntRange(min=1), metavar="N", help="Only the last N lines.")
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object per line (kind: receipt|event)."
)
@click.option("--verify-chain", is_flag=True, help="Check the hash chain; exit 1 on any break.")
@store_option
@errors
def receipts(last: int | None, as_json: bool, verify_chain: bool, store_url: str | None) -> None:
    """Show receipts, with the reconciliation and resolution events between them.

    \b
    Examples:
      ctrlrun receipts --last 20
      ctrlrun receipts --json | jq 'select(.kind=="receipt")'
      ctrlrun receipts --verify-chain
    """
    from .receipts import verify_chain as verify

    store = reader(store_url)
    with store.reading() as conn:
        if verify_chain:
            report = verify(conn)
            click.echo(f"chain: {report.verified} receipts, head seq {report.head_seq}")
            for brk in report.breaks:
                click.echo(f"seq {brk.seq}: {brk.name.replace('_', ' ')}: {brk.detail}")
            if not report.ok:
                sys.exit(1)
            click.echo("chain intact")
            return
        items = views.timeline(conn, last)
    if not items:
        click.echo("no receipts yet")
        return
    for item in items:
        if isinstance(item, views.TimelineEvent):
            click.echo(json.dumps(views.event_json(item)) if as_json else views.event_line(item))
        elif as_json:
            click.echo(json.dumps({"kind": "receipt", **item.to_dict(), "hash": item.hash}))
        else:
            click.echo(views.receipt_line(item))


@main.command()
@click.option(
    "--state",
    type=click.Choice([s.value for s in EffectState if s is not EffectState.NEW]),
    help="Only effects in this state.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@store_option
@errors
def effects(state: str | None, as_json: bool, store_url: str | None) -> None:
    """List effect records, newest first.

    Example: ctrlrun effects --state ambiguous
    """
    from . import ledger

    store = reader(store_url)
    with store.reading() as conn:
        records = ledger.list_effects(conn, EffectState(state) if state else None)
    if not records:
        click.echo(f"no effects are {state}" if state else "no effects yet")
        return
    now = utc_now()
    for rec in records:
        click.echo(json.dumps(views.effect_json(rec)) if as_json else views.effect_line(rec, now))


@main.command("inspect")
@click.argument("action_id")
@click.option("--json", "as_json", is_flag=True, help="The whole inspection as one JSON document.")
@store_option
@errors
def inspect_cmd(action_id: str, as_json: bool, store_url: str | None) -> None:
    """Show one action: its receipt, effect record, approvals and events.

    Example: ctrlrun inspect act_0123456789abcdef0123456789abcdef
    """
    store = reader(store_url)
    with store.reading() as conn:
        found = views.inspection(conn, action_id)
    if found is None:
        fail(f"no action {action_id} in the ledger at {store.location}", 1)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    r = found["receipt"]
    if r:
        click.echo(f"action     {r['action']}  ({action_id})")
        click.echo(
            f"principal  {r['principal']['agent']}"
            + (f" for {r['principal']['user']}" if r["principal"]["user"] else "")
        )
        click.echo(f"arguments  {json.dumps(r['arguments'], sort_keys=True)}")
        click.echo(f"decision   {r['decision']} ({r['decision_reason']})")
        click.echo(f"effect     {r['effect_key'] or '-'}  attempt {r['attempt'] or '-'}")
        click.echo(
            f"receipt    {r['receipt_id']}  {r['result']}"
            + (f"  {r['error']}" if r["error"] else "")
        )
    else:
        click.echo(f"action     {action_id}")
        click.echo("receipt    -  (awaiting a human or still executing)")
    if found["effect"]:
        e = found["effect"]
        click.echo(f"record     {e['effect_key']}  {e['state']}  attempt {e['attempt']}")
    for a in found["approvals"]:
        click.echo(
            f"approval   {a['approval_id']}  {a['status']}"
            + (f"  by {a['approver']}" if a["approver"] else "")
        )
    for i, ev in enumerate(found["events"], 1):
        data = " ".join(f"{k}={v}" for k, v in sorted(ev["data"].items()))
        click.echo(f"{i:3d}  {ev['ts']}  {ev['type']:<28} {data}".rstrip())


@main.command()
@click.argument("effect_key")
@click.option("--committed", is_flag=True, help="The remote did it.")
@click.option("--failed", is_flag=True, help="The remote did not; a retry is permitted.")
@store_option
@errors
def resolve(effect_key: str, committed: bool, failed: bool, store_url: str | None) -> None:
    """Settle an AMBIGUOUS effect by hand, after checking the remote.

    \b
    Examples:
      ctrlrun resolve refund:pi_123 --committed   # the refund exists at Stripe
      ctrlrun resolve refund:pi_123 --failed      # it does not; a retry may run
    """
    if committed == failed:  # neither, or both: a typo must never license a retry
        raise click.UsageError("say what happened: --committed or --failed (exactly one)")
    state = "committed" if committed else "failed"
    from .reconcile import Reconciler

    store = reader(store_url)
    try:
        Reconciler(store, utc_now).resolve(effect_key, state, resolved_by="cli:local")
    except EffectKeyError as exc:
        fail(str(exc), 1)
    click.echo(f"{effect_key} resolved {state} by cli:local")
    if state == "failed":
        click.echo("a retry of this effect is now permitted")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@store_option
@errors
def approvals(as_json: bool, store_url: str | None) -> None:
    """List pending approval requests: the action and the arguments a human is asked to approve.

    Example: ctrlrun approvals && ctrlrun approve apr_…
    """
    from . import ledger

    store = reader(store_url)
    with store.reading() as conn:
        pending = ledger.pending_approvals(conn)
    if not pending:
        click.echo("no pending approvals")
        return
    for row in pending:
        action = json.loads(row["action_json"])
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "request_id": row["approval_id"],
                        "action": action,
                        "created_at": row["created_at"],
                        "expires_at": row["expires_at"],
                    }
                )
            )
            continue
        click.echo(
            f"{row['approval_id']}  {action['name']}  "
            f"{json.dumps(action['arguments'], sort_keys=True)}"
            f"  agent {action['principal']['agent']}  expires {row['expires_at']}"
        )


def _answer(request_id: str, grant: bool, store_url: str | None) -> None:
    from .approvals import answer

    store = reader(store_url)
    try:
        with store.transaction() as conn:
            row = answer(conn, request_id, grant=grant, approver="cli:local", now=utc_now())
    except ApprovalMismatch as exc:
        fail(str(exc), 1)
    if grant:
        click.echo(f"granted {request_id} for {row['action_hash']}")
        click.echo(f"expires {row['expires_at']}")
    else:
        click.echo(f"denied {request_id}")


@main.command()
@click.argument("request_id")
@store_option
@errors
def approve(request_id: str, store_url: str | None) -> None:
    """Grant a pending approval request (single use, for exactly that action).

    Example: ctrlrun approve apr_0123456789abcdef0123456789abcdef
    """
    _answer(request_id, True, store_url)


@main.command()
@click.argument("request_id")
@store_option
@errors
def deny(request_id: str, store_url: str | None) -> None:
    """Deny a pending approval request; presenting it later is recorded as denied.

    Example: ctrlrun deny apr_0123456789abcdef0123456789abcdef
    """
    _answer(request_id, False, store_url)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON document (ctrlrun.stats/v1).")
@store_option
@errors
def stats(as_json: bool, store_url: str | None) -> None:
    """Count receipts by result and action, and effects by state.

    Example: ctrlrun stats --json
    """
    store = reader(store_url)
    with store.reading() as conn:
        counts = views.stats(conn)
    if as_json:
        click.echo(json.dumps(counts))
        return
    click.echo(f"receipts  {counts['receipts']}")
    for k, v in counts["by_result"].items():
        click.echo(f"  {k:<10} {v}")
    for k, v in counts["by_action"].items():
        click.echo(f"  {k:<30} {v}")
    click.echo("effects")
    for k, v in counts["effects"].items():
        click.echo(f"  {k:<10} {v}")


# The sidecar's commands (proxy, demo, reconcile, policy check) live beside this module.
from . import cli_sidecar  # noqa: E402,F401  (registers them on main)

if __name__ == "__main__":  # pragma: no cover
    # Run as ``python -m ctrlrun.cli``: use the imported module, on which every command is
    # registered (this file is then loaded twice, as __main__ and as ctrlrun.cli).
    from ctrlrun.cli import main as registered

    registered()
