"""Answering humans' questions: ``approvals``, ``approve`` and ``deny``."""

from __future__ import annotations

import json

import click

from ctrlrun.errors import ApprovalMismatch

from .common import errors, fail, json_option, operator, operator_option, reader, say, store_option


@click.command()
@json_option
@store_option
@errors
def approvals(as_json: bool, store_url: str | None) -> None:
    """List pending approval requests: the action and the arguments a human is asked to approve.

    Example: ctrlrun approvals && ctrlrun approve apr_…
    """
    from ctrlrun import ledger
    from ctrlrun.action import iso
    from ctrlrun.approvals import progress, required_of

    store = reader(store_url)
    with store.reading() as conn:
        pending = [(row, list(row["approvers"])) for row in ledger.pending_approvals(conn)]
    # A sidecar marks a request expired within seconds of its expiry; without one running
    # (or between its rounds) the row still says pending: it can no longer be granted.
    now = iso(store.clock())
    if not pending:
        say("no pending approvals", as_json=as_json)
    for row, names in pending:
        action = json.loads(row["action_json"])
        required = required_of(row)
        if as_json:
            document = {
                "request_id": row["approval_id"],
                "action": action,
                "created_at": row["created_at"],
                "expires_at": row["expires_at"],
                "approvals_required": required,
                "approvers": names,
                "expired": row["expires_at"] <= now,
            }
            click.echo(json.dumps(document))
            continue
        votes = f"  approved by {', '.join(names)}" if names else ""
        if row["expires_at"] <= now:
            votes = "  (expired: it can no longer be granted)" + votes
        quorum = f" ({progress(len(names), required)})" if required > 1 else ""
        click.echo(
            f"{row['approval_id']}  {action['name']}  "
            f"{json.dumps(action['arguments'], sort_keys=True)}"
            f"  agent {action['principal']['agent']}  expires {row['expires_at']}" + votes + quorum
        )


def _answer(request_id: str, grant: bool, as_name: str | None, store_url: str | None) -> None:
    from ctrlrun.approvals import answer, progress

    who = operator(as_name)
    store = reader(store_url)
    try:
        with store.transaction() as conn:
            row = answer(conn, request_id, grant=grant, approver=who, now=store.clock())
    except ApprovalMismatch as exc:
        fail(str(exc), 1)
    if not grant:
        click.echo(f"denied {request_id} by {who}")
    elif row["status"] == "pending":  # a quorum: this approval is counted, not enough yet
        given, required = len(row["approvals"]), row["approvals_required"]
        click.echo(f"approved {request_id} by {who}: {progress(given, required)}")
    else:
        click.echo(f"granted {request_id} for {row['action_hash']} by {row['approver']}")
        click.echo(f"expires {row['expires_at']}")


@click.command()
@click.argument("request_id")
@operator_option
@store_option
@errors
def approve(request_id: str, as_name: str | None, store_url: str | None) -> None:
    """Grant a pending approval request (single use, for exactly that action).

    Where the action says `approvals_required: N`, it is granted once N different operators
    have approved it; until then each approval is counted and the request stays pending
    (`ctrlrun approvals` shows who approved). The same operator counts once.

    \b
    Examples:
      ctrlrun approve apr_0123456789abcdef0123456789abcdef
      ctrlrun approve apr_0123456789abcdef0123456789abcdef --as alice   # 1 of 2 approvals
    """
    _answer(request_id, True, as_name, store_url)


@click.command()
@click.argument("request_id")
@operator_option
@store_option
@errors
def deny(request_id: str, as_name: str | None, store_url: str | None) -> None:
    """Deny a pending approval request; presenting it later is recorded as denied.

    One deny denies, even of a request that some operators of a quorum already approved.

    Example: ctrlrun deny apr_0123456789abcdef0123456789abcdef
    """
    _answer(request_id, False, as_name, store_url)
