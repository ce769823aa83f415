"""What the guard answers a protected request with, and the decision behind it."""

from __future__ import annotations

from dataclasses import dataclass

from .answers import Answer
from .forward import Forwarded


@dataclass(frozen=True)
class Handled:
    """The response to a protected request, and the decision behind it."""

    response: Answer | Forwarded
    outcome: str  # ctrlrun's answer (X-Ctrlrun-Outcome), or the record's when the remote answered
    reason: str | None = None
    action: str | None = None
    effect_key: str | None = None
    receipt_id: str | None = None
