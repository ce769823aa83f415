"""HTML building blocks: every value is escaped where it enters, pages are whole documents.

No script anywhere: the console works with JavaScript off, and its Content-Security-Policy
allows none. The style sheet is served from ``/console.css`` (``default-src 'self'``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

NAV = (
    ("/approvals", "Approvals", "pending"),
    ("/ambiguous", "Ambiguous effects", "ambiguous"),
    ("/receipts", "Receipts", None),
    ("/freeze", "Freeze", "frozen"),
)

CSS = """\
body { font: 15px/1.45 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
header { background: #1d2b45; color: #fff; padding: .6em 1.2em; display: flex; gap: 1.4em;
  align-items: center; flex-wrap: wrap; }
header a { color: #cfe0ff; text-decoration: none; } header a.here { color: #fff; font-weight: 600; }
header .who { margin-left: auto; } header form { display: inline; }
main { padding: 1em 1.4em; max-width: 80em; }
h1 { font-size: 1.35em; margin: .3em 0 .7em; }
table { border-collapse: collapse; width: 100%; background: #fff; margin-bottom: 1.2em; }
th, td { border: 1px solid #d5d9e0; padding: .35em .55em; text-align: left; vertical-align: top; }
th { background: #e9edf3; } td code, td pre { font-size: .88em; }
pre { margin: 0; white-space: pre-wrap; word-break: break-all; }
.flash { background: #e3f4e6; border: 1px solid #8cc79a; padding: .5em .8em; margin-bottom: 1em; }
.error { background: #fbe6e4; border: 1px solid #e29b93; padding: .5em .8em; margin-bottom: 1em; }
.ok { color: #1c7a35; font-weight: 600; } .bad { color: #b3261e; font-weight: 600; }
.hint { background: #fff8e1; } .badge { background: #d9534f; color: #fff; border-radius: 1em;
  padding: 0 .5em; font-size: .8em; margin-left: .3em; }
button { padding: .25em .8em; margin: .1em; cursor: pointer; }
button.approve, button.committed { background: #dff3e4; } button.deny, button.failed,
button.freeze { background: #fbe3e1; }
input[type=text], input[type=password], textarea { padding: .3em; width: 100%;
  box-sizing: border-box; }
form.login { max-width: 24em; background: #fff; padding: 1.2em; border: 1px solid #d5d9e0; }
form.login label { display: block; margin: .6em 0 .2em; }
"""


def e(value: Any) -> str:
    """Escaped text of any value (None shows as a dash)."""
    return escape("-" if value is None else str(value), quote=True)


def arguments(value: Mapping[str, Any]) -> str:
    return f"<pre>{e(json.dumps(dict(value), sort_keys=True, indent=1))}</pre>"


def table(table_id: str, headers: Sequence[str], rows: Iterable[Sequence[str]], empty: str) -> str:
    """A table whose cells are already HTML; one row saying ``empty`` when there are none."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    if not body:
        body = f'<tr class="empty"><td colspan="{len(headers)}">{e(empty)}</td></tr>'
    return f'<table id="{e(table_id)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def hidden(name: str, value: str) -> str:
    return f'<input type="hidden" name="{e(name)}" value="{e(value)}">'


def form(action: str, csrf: str, inner: str, *, css_class: str = "") -> str:
    """A POST form carrying the session's CSRF token."""
    cls = f' class="{e(css_class)}"' if css_class else ""
    return f'<form method="post" action="{e(action)}"{cls}>{hidden("csrf", csrf)}{inner}</form>'


def button(label: str, *, name: str = "", value: str = "", css_class: str = "") -> str:
    attrs = f' name="{e(name)}" value="{e(value)}"' if name else ""
    cls = f' class="{e(css_class)}"' if css_class else ""
    return f'<button type="submit"{attrs}{cls}>{e(label)}</button>'


def document(
    title: str,
    body: str,
    *,
    here: str = "",
    operator: str | None = None,
    csrf: str = "",
    base: str = "",
    counts: Mapping[str, int] | None = None,
    messages: Sequence[str] = (),
    errors: Sequence[str] = (),
) -> str:
    """A whole page: the navigation (when logged in, its links under the session's ``base``),
    messages, then ``body``."""
    header = "<header><strong>ctrlrun console</strong>"
    if operator is not None:
        for path, label, count_key in NAV:
            n = (counts or {}).get(count_key or "", 0)
            badge = f'<span class="badge">{n}</span>' if n else ""
            here_cls = ' class="here"' if path == here else ""
            header += f'<a href="{e(base + path)}"{here_cls}>{e(label)}{badge}</a>'
        logout = form(base + "/logout", csrf, button("Log out"))
        header += f'<span class="who">{e(operator)} {logout}</span>'
    header += "</header>"
    notes = "".join(f'<div class="flash" role="status">{e(m)}</div>' for m in messages)
    notes += "".join(f'<div class="error" role="alert">{e(m)}</div>' for m in errors)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{e(title)} · ctrlrun</title><link rel="stylesheet" href="/console.css">'
        f"</head><body>{header}<main><h1>{e(title)}</h1>{notes}{body}</main></body></html>\n"
    )
