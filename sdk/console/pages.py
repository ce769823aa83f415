"""The bodies of the console's pages, from the values ``board.py`` reads. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from ctrlrun.freeze import ALL, Freeze
from ctrlrun.receipts import ChainReport, Receipt

from .board import Pending, Unsettled, shown_time
from .html import arguments, button, e, form, hidden, table


def login(csrf: str, page: str = "/approvals") -> str:
    """The login form; ``page`` is where it leads (a hidden field: one of the pages)."""
    # The name is typed, not chosen from a list: the page does not tell strangers who operates.
    inner = (
        '<label for="operator">Operator</label>'
        '<input id="operator" type="text" name="operator" autocomplete="username" required>'
        '<label for="token">Token</label>'
        '<input id="token" type="password" name="token" autocomplete="current-password" '
        "required>"
        f"<p>{button('Log in', css_class='login')}</p>" + hidden("next", page)
    )
    intro = (
        "<p>Log in with your operator token: the value of the environment variable that "
        "<code>operators:</code> names for you in the policy.</p>"
    )
    return intro + form("/login", csrf, inner, css_class="login").replace(
        "<form ", '<form id="login" ', 1
    )


def approvals(rows: Sequence[Pending], csrf: str, base: str = "") -> str:
    cells = []
    for p in rows:
        user = f" for {e(p.user)}" if p.user else ""
        expiry = e(shown_time(p.expires_at)) + (' <span class="bad">expired</span>' * p.expired)
        answer = form(
            base + "/approvals/answer",
            csrf,
            hidden("request_id", p.request_id)
            + button("Approve", name="decision", value="approve", css_class="approve")
            + button("Deny", name="decision", value="deny", css_class="deny"),
        )
        cells.append(
            [
                f"<code>{e(p.request_id)}</code>",
                e(p.action),
                arguments(p.arguments),
                e(p.agent) + user,
                e(shown_time(p.created_at)),
                expiry,
                e(p.votes),
                answer,
            ]
        )
    headers = ["Request", "Action", "Arguments", "Agent", "Asked", "Expires", "Approved by", ""]
    intro = (
        "<p>An approval covers exactly this action with these arguments, once. Once granted, "
        "the agent re-sends its request and it goes through.</p>"
    )
    return intro + table("approvals", headers, cells, "no pending approvals")


def ambiguous(rows: Sequence[Unsettled], csrf: str, base: str = "") -> str:
    cells = []
    for u in rows:
        settle = form(
            base + "/ambiguous/settle",
            csrf,
            hidden("effect_key", u.effect_key)
            + f'<textarea name="note" rows="2" required aria-label="note for {e(u.effect_key)}" '
            'placeholder="What you checked (required)"></textarea>'
            + button(
                "It happened: committed", name="state", value="committed", css_class="committed"
            )
            + button("It did not: failed", name="state", value="failed", css_class="failed"),
        )
        last = f", last answer {e(u.last_answer)}" if u.last_answer else ""
        cells.append(
            [
                f"<code>{e(u.effect_key)}</code>",
                e(u.action) + arguments(u.arguments),
                e(u.agent),
                e(shown_time(u.since)),
                f"{u.checks} (attempt {u.attempt}){last}",
                f'<div class="hint"><strong>Check the remote:</strong> {e(u.hint)}</div>' + settle,
            ]
        )
    headers = ["Effect key", "Action", "Agent", "Ambiguous since", "Checks", "Settle"]
    intro = (
        "<p>Nobody knows whether these happened: the remote's answer was lost. Look at the "
        "remote first, then settle each one with a note saying what you found. <em>Failed</em> "
        "permits a retry, so choose it only when you are sure it did not happen.</p>"
    )
    return intro + table("ambiguous", headers, cells, "no ambiguous effects")


def receipts(rows: Sequence[Receipt], report: ChainReport) -> str:
    walked = (
        ""
        if report.first_seq == 1
        else f" (the newest, from seq {report.first_seq}: <code>ctrlrun receipts "
        "--verify-chain</code> walks them all)"
    )
    if report.ok:
        status = (
            f'<p id="chain" class="ok">Chain intact: {report.verified} receipts{walked}, head '
            f"seq {report.head_seq}.</p>"
        )
    else:
        breaks = "".join(
            f"<li>seq {b.seq}: {e(b.name.replace('_', ' '))}: {e(b.detail)}</li>"
            for b in report.breaks
        )
        status = (
            f'<p id="chain" class="bad">Chain broken: {len(report.breaks)} breaks in '
            f"{report.verified} receipts{walked} (run <code>ctrlrun doctor</code>).</p>"
            f"<ul>{breaks}</ul>"
        )
    cells = []
    for r in rows:
        d = r.document
        by = d.get("approver")
        cells.append(
            [
                e(d.get("seq")),
                e(shown_time(d.get("finished_at"))),
                e(d.get("action")),
                e(f"{d.get('decision')}/{d.get('result')}"),
                f"<code>{e(d.get('effect_key'))}</code>",
                e((d.get("principal") or {}).get("agent")),
                e(by),
                f"<code>{e(d.get('receipt_id'))}</code>",
            ]
        )
    headers = ["Seq", "Finished", "Action", "Decision/result", "Effect key", "Agent", "Approver"]
    return status + table("receipts", [*headers, "Receipt"], cells, "no receipts yet")


def freeze(rows: Sequence[Freeze], csrf: str, base: str = "") -> str:
    cells = [
        [
            e("every action" if f.scope == ALL else f.scope),
            e(f.reason),
            e(f.frozen_by),
            e(shown_time(f.frozen_at)),
            form(base + "/unfreeze", csrf, hidden("scope", f.scope) + button("Unfreeze")),
        ]
        for f in rows
    ]
    status = (
        '<p class="bad">Protected writes of the actions below are refused (outcome '
        "<code>frozen</code>) by every sidecar and SDK process on this ledger.</p>"
        if rows
        else '<p class="ok">Nothing is frozen.</p>'
    )
    new = form(
        base + "/freeze",
        csrf,
        '<label for="action">Action (empty: every action)</label>'
        '<input id="action" type="text" name="action" placeholder="e.g. stripe.refund">'
        '<label for="reason">Reason (shown to every agent refused)</label>'
        '<input id="reason" type="text" name="reason" required>'
        f"<p>{button('Freeze', css_class='freeze')}</p>",
        css_class="login",
    )
    headers = ["Frozen", "Reason", "By", "Since", ""]
    return (
        status
        + table("freezes", headers, cells, "nothing is frozen")
        + "<h2>Freeze every action, or one</h2>"
        + new
    )
