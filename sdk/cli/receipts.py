"""Reading what happened: ``receipts``, ``inspect`` and ``stats``."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ctrlrun import views
from ctrlrun.store import StateStore

from .common import errors, fail, reader, say, store_option


@click.command()
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
    store = reader(store_url)
    if verify_chain:
        _verify(store)
        return
    with store.reading() as conn:
        items = views.timeline(conn, last)
    if not items:
        say("no receipts yet", as_json=as_json)
    for item in items:
        if isinstance(item, views.TimelineEvent):
            click.echo(json.dumps(views.event_json(item)) if as_json else views.event_line(item))
        elif as_json:
            click.echo(json.dumps({"kind": "receipt", **item.to_dict(), "hash": item.hash}))
        else:
            click.echo(views.receipt_line(item))


def _verify(store: StateStore) -> None:
    from ctrlrun.receipts import verify_chain

    with store.reading() as conn:
        report = verify_chain(conn)
    click.echo(f"chain: {report.verified} receipts, head seq {report.head_seq}")
    for brk in report.breaks:
        click.echo(f"seq {brk.seq}: {brk.name.replace('_', ' ')}: {brk.detail}")
    if not report.ok:
        sys.exit(1)
    click.echo("chain intact")


@click.command("inspect")
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
    for line in _inspection_lines(action_id, found):
        click.echo(line)


def _inspection_lines(action_id: str, found: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    r = found["receipt"]
    if r:
        user = f" for {r['principal']['user']}" if r["principal"]["user"] else ""
        error = f"  {r['error']}" if r["error"] else ""
        lines += [
            f"action     {r['action']}  ({action_id})",
            f"principal  {r['principal']['agent']}{user}",
            f"arguments  {json.dumps(r['arguments'], sort_keys=True)}",
            f"decision   {r['decision']} ({r['decision_reason']})",
            f"effect     {r['effect_key'] or '-'}  attempt {r['attempt'] or '-'}",
            f"receipt    {r['receipt_id']}  {r['result']}{error}",
        ]
    else:
        lines += [f"action     {action_id}", "receipt    -  (awaiting a human or still executing)"]
    if found["effect"]:
        e = found["effect"]
        lines.append(f"record     {e['effect_key']}  {e['state']}  attempt {e['attempt']}")
        if e["state"] == "ambiguous":
            due = e.get("next_check_at") or "now"
            last = f", last answer {e['check_answer']}" if e.get("check_answer") else ""
            lines.append(f"checks     asked {e.get('checks') or 0} times{last}, next check {due}")
    for a in found["approvals"]:
        names = [v["operator"] for v in a.get("votes", ()) if v["decision"] == "grant"]
        by = f"  by {a['approver']}" if a["approver"] else ""
        if names and not by:  # a quorum still short of its number
            by = f"  approved by {', '.join(names)}"
        need = a.get("approvals_required") or 1
        quorum = f"  ({len(names)} of {need} approvals)" if need > 1 else ""
        lines.append(f"approval   {a['approval_id']}  {a['status']}{by}{quorum}")
    for i, ev in enumerate(found["events"], 1):
        data = " ".join(f"{k}={v}" for k, v in sorted(ev["data"].items()))
        lines.append(f"{i:3d}  {ev['ts']}  {ev['type']:<28} {data}".rstrip())
    return lines


@click.command()
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
