"""The answers ctrlrun gives in the remote's place, shaped so the agent's own SDK raises them.

Each is a JSON error in the remote's shape (a Stripe ``error``, a Kubernetes ``Status``, a
plain ``error`` for ``http``) with a ``ctrlrun`` block beside it and a message that starts
with ``ctrlrun:`` and says what to do next. None carries ``Retry-After``; Stripe answers
carry ``Stripe-Should-Retry: false`` (stripe-python retries 409 and 5xx otherwise), and
Kubernetes answers are never 409 (kubectl scale retries a conflict for five minutes).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

# outcome: (stripe, kubernetes, http)
STATUSES: dict[str, tuple[int, int, int]] = {
    "denied": (403, 403, 403),
    "frozen": (403, 403, 403),
    "budget_exceeded": (403, 403, 403),
    "approval_required": (403, 403, 403),
    "approval_invalid": (403, 403, 403),
    "duplicate": (409, 403, 409),
    "in_progress": (409, 403, 409),
    "ambiguous": (409, 403, 409),
    "upstream_ambiguous": (504, 504, 504),
    "invalid_request": (400, 422, 400),
    "unavailable": (503, 503, 503),
}
PROFILES = ("stripe", "kubernetes", "http")
_KUBE_REASONS = {403: "Forbidden", 422: "Invalid", 503: "ServiceUnavailable", 504: "Timeout"}


@dataclass(frozen=True)
class Answer:
    """A synthesised HTTP response."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


def answer(
    profile: str,
    outcome: str,
    *,
    reason: str,
    message: str,
    action: str | None,
    effect_key: str | None,
    receipt_id: str | None,
    request_id: str | None = None,
    resend: bool = False,
) -> Answer:
    """Build the answer for ``outcome`` in ``profile``'s error shape.

    ``message`` says what happened; the next step for the agent is added to it. ``reason``
    is the short machine reason (for ``upstream_ambiguous``, what the reconciler found).
    Raises ``ValueError`` for an unknown profile or outcome: that is a bug in the caller.
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}")
    if outcome not in STATUSES:
        raise ValueError(f"unknown outcome {outcome!r}")
    status = STATUSES[outcome][PROFILES.index(profile)]
    text = _message(outcome, message, effect_key=effect_key, request_id=request_id, resend=resend)
    block: dict[str, Any] = {
        "outcome": outcome,
        "reason": reason,
        "action": action,
        "effect_key": effect_key,
        "receipt_id": receipt_id,
    }
    if request_id is not None:
        block["request_id"] = request_id
    code = f"ctrlrun_{outcome}"
    headers = [("Content-Type", "application/json"), ("X-Ctrlrun-Outcome", outcome)]
    body: dict[str, Any]
    if profile == "stripe":
        kind = "api_error" if status >= 500 else "invalid_request_error"
        body = {"error": {"type": kind, "code": code, "message": text}, "ctrlrun": block}
        headers.append(("Stripe-Should-Retry", "false"))
    elif profile == "kubernetes":
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": text,
            "reason": _KUBE_REASONS[status],
            "details": {"causes": [{"reason": code, "message": reason}]},
            "code": status,
            "ctrlrun": block,
        }
    else:
        body = {"error": {"message": text, "code": code}, "ctrlrun": block}
    # ensure_ascii: the bytes stay 7-bit whatever the caller's text holds.
    return Answer(status, tuple(headers), json.dumps(body, ensure_ascii=True).encode("ascii"))


def _message(
    outcome: str, message: str, *, effect_key: str | None, request_id: str | None, resend: bool
) -> str:
    """``ctrlrun: <what happened>. <what to do next>``"""
    what = message.strip()
    if what.lower().startswith("ctrlrun:"):
        what = what[len("ctrlrun:") :].strip()
    what = what.rstrip(". ") or outcome.replace("_", " ")
    key = shlex.quote(effect_key) if effect_key else "KEY"
    effect = f"effect {effect_key!r}" if effect_key else "this effect"
    approval = request_id or "apr_…"
    hints = {
        "denied": "Nothing was forwarded; do not retry: ask an operator to change the policy "
        "if this action should be allowed",
        "frozen": "Nothing was forwarded; do not retry until an operator lifts the freeze "
        "('ctrlrun unfreeze')",
        "budget_exceeded": "Nothing was forwarded; the action's budget: has too little left in "
        "this window ('ctrlrun budgets' shows what is left); retry after the window turns",
        "approval_required": f"A human must approve it: run 'ctrlrun approve {approval}'; then "
        + (
            "re-send the identical request, once (no header needed; a changed request is a "
            f"new one; Ctrlrun-Approval: {approval} may be sent too)"
            if resend
            else f"re-send the same request with header Ctrlrun-Approval: {approval} "
            "(this action's policy says approval: header)"
        ),
        "approval_invalid": "Nothing was forwarded; re-send the exact request the approval was "
        "granted for, or re-send without Ctrlrun-Approval to ask for a new approval",
        "duplicate": f"{effect[0].upper()}{effect[1:]} has already happened; do not retry "
        "('ctrlrun receipts' shows it)",
        "in_progress": f"Another attempt is executing {effect}; do not retry now: "
        "'ctrlrun receipts' shows its outcome when it ends",
        "ambiguous": f"Nobody knows whether {effect} happened, so a retry is refused: wait "
        f"for reconciliation, run 'ctrlrun reconcile {key}', or settle it with "
        f"'ctrlrun resolve {key} --committed' (or --failed)",
        "upstream_ambiguous": f"The remote's reply was lost, so {effect} may or may not have "
        f"happened; do not retry blindly: run 'ctrlrun reconcile {key}', or settle it with "
        f"'ctrlrun resolve {key} --committed' (or --failed)",
        "invalid_request": "Nothing was forwarded; fix the request and re-send it",
        "unavailable": "Nothing was forwarded; re-sending later is safe",
    }
    return f"ctrlrun: {what}. {hints[outcome]}."
