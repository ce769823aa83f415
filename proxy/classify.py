"""Outcome classification: what an upstream's answer (or silence) says about the effect.

Only evidence that the remote did nothing makes ``failed``; everything else that is not a
2xx is ``ambiguous`` and goes to a reconciler or a human::

    nothing sent (DNS, refused, connect timeout, TLS handshake)   failed
    2xx                                                            committed
    4xx except 408 and 424 (Stripe 402 included)                   failed
    408, 424, 5xx, 1xx, 3xx, sent but no status line               ambiguous
    Stripe 409 (another request with this Idempotency-Key runs)    ambiguous
"""

from __future__ import annotations

import json
from enum import StrEnum

# What the record of an attempt becomes: the kernel's own type, the one ``Control.finish`` takes.
from ctrlrun.control import Outcome


class Transport(StrEnum):
    """A transport failure, for when no status line arrived."""

    NOT_SENT = "not_sent"  # DNS failure, refused, connect timeout, TLS handshake failure
    SENT_NO_STATUS = "sent_no_status"  # timeout, reset or EOF after (or while) sending


# Phrases of the apiserver's 409 to a DELETE of a namespace that is already terminating:
# "Operation cannot be fulfilled on namespaces "x": The system is ensuring all content is
# removed from this namespace. ..." (the namespace registry's Delete).
_TERMINATING = (
    "ensuring all content is removed",
    "is terminating",
    "being terminated",
    "being deleted",
)


def classify(
    profile: str,
    action: str,
    *,
    status: int | None,
    transport: Transport | None,
    body: bytes = b"",
) -> Outcome:
    """Classify one attempt.

    A status line that arrived decides, even if the body was then cut short or the
    transport reports an error afterwards. Without one, only ``Transport.NOT_SENT`` proves
    nothing happened; no status and no transport evidence at all is ``ambiguous``.
    """
    if status is None:
        return "failed" if transport is Transport.NOT_SENT else "ambiguous"
    if 200 <= status <= 299:
        return "committed"
    if status == 409 and profile == "kubernetes" and action == "k8s.delete_namespace":
        # The namespace is already being deleted: the effect exists.
        return "committed" if _namespace_terminating(body) else "failed"
    if status == 409 and profile == "stripe":
        # idempotency_key_in_use: another request with this key is still running at Stripe,
        # and it may yet apply the effect this attempt names.
        return "ambiguous"
    if 400 <= status <= 499 and status not in (408, 424):
        return "failed"
    # 408 and 424 may have run, a 5xx may have committed before failing, and ctrlrun's
    # client follows no redirects, so a 1xx or 3xx final answer proves nothing either way.
    return "ambiguous"


def _namespace_terminating(body: bytes) -> bool:
    try:
        status = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return False
    if not isinstance(status, dict) or status.get("kind") != "Status":
        return False
    message = status.get("message")
    if not isinstance(message, str):
        return False
    lowered = message.lower()
    return any(phrase in lowered for phrase in _TERMINATING)
