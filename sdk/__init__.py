"""ctrlrun: consequential actions happen at most once, only as the policy allows, with a receipt.

The SDK entrance is :func:`protect`; the sidecar proxy is ``ctrlrun proxy`` (the ``proxy``
extra). Both write to one ledger, read with the ``ctrlrun`` CLI.
"""

from __future__ import annotations

from .action import Action, Principal, action_hash, canonicalize
from .context import context, idempotency_token, with_approval
from .control import Control
from .errors import (
    ActionDenied,
    ActionFrozen,
    AmbiguousEffect,
    ApprovalMismatch,
    ApprovalRequired,
    ApprovalTimeout,
    BudgetExceeded,
    CTRLRunError,
    DuplicateEffect,
    EffectKeyError,
    InvalidArgument,
    MissingDependency,
    NotExecuted,
    PolicyError,
    SchemaMismatch,
    StoreError,
)
from .events import EventType
from .policy import Decision, Policy
from .protect import protect
from .receipts import Receipt
from .reconcile import ReconcileOutcome
from .states import EffectRecord, EffectState
from .store import PostgresStateStore, SQLiteStateStore, StateStore

__version__ = "0.1.0"

__all__ = [
    "Action",
    "ActionDenied",
    "ActionFrozen",
    "AmbiguousEffect",
    "ApprovalMismatch",
    "ApprovalRequired",
    "ApprovalTimeout",
    "BudgetExceeded",
    "CTRLRunError",
    "Control",
    "Decision",
    "DuplicateEffect",
    "EffectKeyError",
    "EffectRecord",
    "EffectState",
    "EventType",
    "InvalidArgument",
    "MissingDependency",
    "NotExecuted",
    "Policy",
    "PolicyError",
    "PostgresStateStore",
    "Principal",
    "Receipt",
    "ReconcileOutcome",
    "SQLiteStateStore",
    "SchemaMismatch",
    "StateStore",
    "StoreError",
    "action_hash",
    "canonicalize",
    "context",
    "idempotency_token",
    "protect",
    "with_approval",
]
