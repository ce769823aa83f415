"""Notifications: the ``notify:`` section, and what one webhook delivery carries.

::

    notify:
      - url: https://hooks.example.com/ctrlrun
        secret_env: CTRLRUN_WEBHOOK_SECRET
        events: [approval.requested, approval.granted, effect.ambiguous]   # default: all
        format: json                      # or slack
        console_url: https://ctrlrun.internal:9091   # optional: a link in each message

Each delivery is a POST of one JSON document, signed as Stripe signs its webhooks:
``Ctrlrun-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>" with the secret>``, with
the event's id in ``Ctrlrun-Event-Id`` (a receiver that sees one twice, after a crash between
sending and recording, drops it). Nothing in it is a credential: actions, arguments, agents,
effect keys and operators, as the receipts carry them. The deliveries themselves are sent by
``notifier.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ctrlrun.errors import PolicyError
from ctrlrun.events import EventType
from ctrlrun.policy_sections import Section, SectionContext
from ctrlrun.yamlstrict import Where, YamlList, check_keys, expect_choice, expect_map, show

# Which events are reported, and as what. RECONCILIATION_RESOLVED reports only a settled
# answer (committed or failed); an ``unknown`` is not news.
EVENTS: Mapping[str, str] = {
    EventType.APPROVAL_REQUESTED: "approval.requested",
    EventType.APPROVAL_GRANTED: "approval.granted",
    EventType.APPROVAL_DENIED: "approval.denied",
    EventType.APPROVAL_EXPIRED: "approval.expired",
    EventType.EXECUTION_AMBIGUOUS: "effect.ambiguous",
    EventType.RECONCILIATION_RESOLVED: "effect.resolved",
    EventType.EFFECT_RESOLVED: "effect.resolved",
    EventType.LEDGER_FROZEN: "ledger.frozen",
    EventType.LEDGER_UNFROZEN: "ledger.unfrozen",
}
NAMES = tuple(dict.fromkeys(EVENTS.values()))
FORMATS = ("json", "slack")
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Webhook:
    """One webhook: where, the variable holding its secret, which events, in what format."""

    url: str
    secret_env: str
    events: frozenset[str]
    format: str = "json"
    console_url: str | None = None

    @property
    def target(self) -> str:
        """Its cursor's name in the ledger: the same webhook on every sidecar."""
        return "wh_" + hashlib.sha256(self.url.encode("utf-8")).hexdigest()[:32]

    @property
    def shown(self) -> str:
        """The webhook as a log line or a metric names it: its scheme and host, and its cursor.

        A receiver's URL is often its credential (Slack's and Discord's carry a token in the
        path, others in the query), so neither its path nor its query is ever shown."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host
        port = f":{parts.port}" if parts.port is not None else ""
        return f"{parts.scheme}://{host}{port}/... ({self.target[:11]})"

    def secret(self) -> bytes:
        value = os.environ.get(self.secret_env, "")
        if not value:
            raise PolicyError(f"notify: ${self.secret_env} (the secret of {self.shown}) is not set")
        return value.encode("utf-8")


def _url(value: Any, where: Where) -> str:
    parts = urlsplit(value) if isinstance(value, str) else None
    try:
        port_ok = parts is not None and (parts.port is None or parts.port > 0)
    except ValueError:
        port_ok = False
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        # Not echoed: a receiver's URL can be its credential.
        what = f"scheme {show(parts.scheme)}" if parts is not None else show(type(value).__name__)
        raise where.error(f"must be an http(s) URL with a host, got {what}")
    return str(value)


def _webhook(entry: Any, where: Where) -> Webhook:
    keys = ("url", "secret_env", "events", "format", "console_url")
    doc = expect_map(entry, where)
    check_keys(doc, where, keys, required=("url", "secret_env"))
    env = doc["secret_env"]
    if not isinstance(env, str) or not _ENV.fullmatch(env):
        raise where.key(doc, "secret_env").error(
            f"must be the name of an environment variable, got {show(env)}"
        )
    events = doc.get("events", list(NAMES))
    if not isinstance(events, list) or not events:
        raise where.key(doc, "events").error(f"must be a list of: {', '.join(NAMES)}")
    for name in events:
        expect_choice(name, where.key(doc, "events"), NAMES)
    fmt = expect_choice(doc.get("format", "json"), where.key(doc, "format"), FORMATS)
    console = doc.get("console_url")
    return Webhook(
        _url(doc["url"], where.key(doc, "url")),
        env,
        frozenset(events),
        str(fmt),
        None if console is None else _url(console, where.key(doc, "console_url")),
    )


def _parse(value: Any, where: Where, _: SectionContext) -> tuple[Webhook, ...]:
    if not isinstance(value, YamlList):
        raise where.error("must be a list of webhooks ({url, secret_env, events, format})")
    hooks = tuple(_webhook(entry, where.index(value, i)) for i, entry in enumerate(value))
    if len({h.url for h in hooks}) != len(hooks):
        raise where.error("the same url twice: give each webhook once, with all its events")
    return hooks


NOTIFY: Section[tuple[Webhook, ...]] = Section("notify", _parse, empty=())


def sign(secret: bytes, body: bytes, t: int) -> str:
    """``t=<unix>,v1=<hex>``: HMAC-SHA256 of ``"<t>.<body>"``, Stripe's scheme."""
    mac = hmac.new(secret, f"{t}.".encode("ascii") + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def document(event: Mapping[str, Any], name: str, details: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON a webhook receives for one event row (with what the ledger adds about it)."""
    data = json.loads(event["data_json"] or "{}")
    data.pop("action_hash", None)
    return {
        "id": f"evt_{event['event_id']}",
        "type": name,
        "created": event["ts"],
        "action_id": event["action_id"],
        "effect_key": event["effect_key"],
        "approval_id": event["approval_id"],
        "data": {**data, **details},
    }


def slack(doc: Mapping[str, Any], console_url: str | None) -> dict[str, Any]:
    """A Slack-compatible message (``text``) for one event."""
    d = doc["data"]
    what = d.get("action") or doc.get("effect_key") or d.get("scope") or ""
    args = json.dumps(d["arguments"], sort_keys=True) if "arguments" in d else ""
    agent = f" agent {d['agent']}" if d.get("agent") else ""
    lines = [f"*ctrlrun: {doc['type']}* {what} {args}{agent}".rstrip()]
    if doc["type"] == "approval.requested":
        lines.append(f"approve: `ctrlrun approve {doc['approval_id']}`")
    if console_url:
        lines.append(f"<{console_url}|open the console>")
    return {"text": "\n".join(lines)}


def body_for(hook: Webhook, doc: Mapping[str, Any]) -> bytes:
    payload = slack(doc, hook.console_url) if hook.format == "slack" else doc
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode("utf-8")


def wanted(hooks: Sequence[Webhook]) -> frozenset[str]:
    return frozenset(name for h in hooks for name in h.events)
