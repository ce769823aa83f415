"""The public API: a pinned, sorted ``__all__``, and an import that pulls in no extra."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest

import ctrlrun

PINNED = [
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

ERRORS = [
    "ActionDenied",
    "AmbiguousEffect",
    "ApprovalMismatch",
    "ApprovalRequired",
    "ApprovalTimeout",
    "DuplicateEffect",
    "EffectKeyError",
    "InvalidArgument",
    "MissingDependency",
    "NotExecuted",
    "PolicyError",
    "SchemaMismatch",
    "StoreError",
]


def test_all_is_sorted_and_pinned() -> None:
    assert ctrlrun.__all__ == sorted(ctrlrun.__all__)
    assert ctrlrun.__all__ == PINNED
    for name in ctrlrun.__all__:
        assert hasattr(ctrlrun, name), name


@pytest.mark.parametrize("name", ERRORS)
def test_every_error_is_a_ctrlrun_error(name: str) -> None:
    assert issubclass(getattr(ctrlrun, name), ctrlrun.CTRLRunError)


@pytest.mark.parametrize(
    ("exc", "attrs"),
    [
        (ctrlrun.ActionDenied("no_principal"), {"reason": "no_principal"}),
        (ctrlrun.ApprovalRequired("apr_1"), {"request_id": "apr_1"}),
        (ctrlrun.ApprovalMismatch("consumed"), {"reason": "consumed"}),
        (ctrlrun.ApprovalTimeout("apr_1"), {"request_id": "apr_1"}),
        (
            ctrlrun.DuplicateEffect(state="in_progress", effect_key="k"),
            {"state": "in_progress", "effect_key": "k"},
        ),
        (ctrlrun.AmbiguousEffect("k"), {"effect_key": "k"}),
        (
            ctrlrun.MissingDependency("psycopg", "postgres"),
            {"module": "psycopg", "extra": "postgres"},
        ),
    ],
)
def test_errors_carry_their_context(exc: Exception, attrs: dict[str, str]) -> None:
    for attr, value in attrs.items():
        assert getattr(exc, attr) == value
    assert str(exc)


def test_missing_dependency_names_the_install() -> None:
    assert "pip install 'ctrlrun[postgres]'" in str(
        ctrlrun.MissingDependency("psycopg", "postgres")
    )


def test_protect_signature_is_keyword_only() -> None:
    params = inspect.signature(ctrlrun.protect).parameters
    assert list(params) == [
        "name",
        "effect",
        "resource",
        "reconcile",
        "reconcile_eagerly",
        "lease",
        "wait",
        "control",
    ]
    assert all(p.kind is p.KEYWORD_ONLY for n, p in params.items() if n != "name")


def test_import_pulls_in_no_extra() -> None:
    code = (
        "import json, sys, ctrlrun\n"
        "heavy = ('mitmproxy', 'httpx', 'psycopg')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == []
