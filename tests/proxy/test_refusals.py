"""The exception -> (outcome, reason, status) table, over every ``CTRLRunError`` there is.

As httpx tests its exception map: the subclasses are enumerated (every module of the package
imported first), so a new exception without a row of its own fails here.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import ctrlrun
import ctrlrun.proxy
import ctrlrun.reconcilers
from ctrlrun.errors import (
    ActionDenied,
    ActionFrozen,
    AmbiguousEffect,
    ApprovalMismatch,
    ApprovalRequired,
    ApprovalTimeout,
    BudgetExceeded,
    ConnectionLost,
    CTRLRunError,
    DuplicateEffect,
    EffectKeyError,
    InvalidArgument,
    MissingDependency,
    NotExecuted,
    OutcomeUnknown,
    PolicyError,
    SchemaMismatch,
    StoreError,
)
from ctrlrun.identity import LedgerLost
from ctrlrun.proxy.answers import PROFILES, STATUSES
from ctrlrun.proxy.refusals import REFUSALS, refusal_for
from ctrlrun.reconcile import NotAmbiguous
from ctrlrun.store import NoLedger


def all_subclasses(cls: type[BaseException]) -> set[type[BaseException]]:
    found: set[type[BaseException]] = set()
    for sub in cls.__subclasses__():
        found |= {sub} | all_subclasses(sub)
    return found


def import_everything() -> None:
    """Import every module of the three packages (migrations aside: they run on import)."""
    for package in (ctrlrun, ctrlrun.proxy, ctrlrun.reconcilers):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if ".migrations" not in info.name and not info.name.endswith("__main__"):
                importlib.import_module(info.name)


# (exception, outcome, reason, request_id), one row per CTRLRunError there is.
EXPECTED: list[tuple[CTRLRunError, str, str, str | None]] = [
    (ActionDenied("no_rule_matched"), "denied", "no_rule_matched", None),
    (ActionFrozen("every action is frozen by alice: incident"), "frozen", "frozen", None),
    (BudgetExceeded("refund: 5 left"), "budget_exceeded", "budget_exceeded", None),
    (ApprovalRequired("apr_1"), "approval_required", "approval_required", "apr_1"),
    (ApprovalMismatch("mismatch", approval_id="apr_2"), "approval_invalid", "mismatch", "apr_2"),
    (ApprovalTimeout("apr_3"), "approval_invalid", "approval_timeout", "apr_3"),
    (DuplicateEffect(state="committed", effect_key="k"), "duplicate", "committed", None),
    (AmbiguousEffect("k"), "ambiguous", "ambiguous", None),
    (InvalidArgument("a float"), "invalid_request", "invalid_argument", None),
    (EffectKeyError("no {x}"), "invalid_request", "effect_key_error", None),
    (StoreError("down"), "unavailable", "store_unavailable", None),
    (SchemaMismatch("newer"), "unavailable", "store_unavailable", None),
    (NoLedger("none here"), "unavailable", "store_unavailable", None),
    (LedgerLost("deleted"), "unavailable", "store_unavailable", None),
    (ConnectionLost("reset"), "unavailable", "store_unavailable", None),
    (OutcomeUnknown("reset with the COMMIT sent"), "unavailable", "store_unavailable", None),
    (NotAmbiguous("k is committed"), "unavailable", "internal_error", None),
    (PolicyError("bad"), "unavailable", "internal_error", None),
    (NotExecuted("nothing"), "unavailable", "internal_error", None),
    (MissingDependency("psycopg", "postgres"), "unavailable", "internal_error", None),
    (CTRLRunError("something"), "unavailable", "internal_error", None),
]


def test_every_ctrlrun_error_has_a_row_of_its_own() -> None:
    import_everything()
    ours = {c for c in all_subclasses(CTRLRunError) if c.__module__.startswith("ctrlrun.")}
    classes = ours | {CTRLRunError}
    assert len(classes) > 10, "the enumeration found too little to be trusted"
    assert classes - set(REFUSALS) == set(), "add a row to proxy/refusals.py"
    assert {type(exc) for exc, *_ in EXPECTED} == classes, "add the row to EXPECTED here too"


@pytest.mark.parametrize(("exc", "outcome", "reason", "request_id"), EXPECTED)
def test_the_table(exc: CTRLRunError, outcome: str, reason: str, request_id: str | None) -> None:
    exc.receipt_id = "ctr_1"

    refusal = refusal_for(exc, action="stripe.refund", effect_key="refund:pi_1")

    assert (refusal.outcome, refusal.reason, refusal.request_id) == (outcome, reason, request_id)
    assert (refusal.action, refusal.effect_key, refusal.receipt_id) == (
        "stripe.refund",
        "refund:pi_1",
        "ctr_1",
    )
    for profile, status in zip(PROFILES, STATUSES[outcome], strict=True):
        assert refusal.answer(profile).status == status


@pytest.mark.parametrize(
    ("exc", "statuses"),
    [
        (DuplicateEffect(state="committed", effect_key="k"), (409, 403, 409)),
        (DuplicateEffect(state="in_progress", effect_key="k"), (409, 403, 409)),
        (ApprovalRequired("apr_1"), (403, 403, 403)),
        (InvalidArgument("x"), (400, 422, 400)),
        (StoreError("x"), (503, 503, 503)),
        (KeyError("bug"), (503, 503, 503)),
    ],
)
def test_statuses_per_profile(exc: Exception, statuses: tuple[int, int, int]) -> None:
    refusal = refusal_for(exc)
    assert tuple(refusal.answer(p).status for p in PROFILES) == statuses


def test_an_in_progress_duplicate_is_not_called_committed() -> None:
    refusal = refusal_for(DuplicateEffect(state="in_progress", effect_key="k"))
    assert (refusal.outcome, refusal.reason) == ("in_progress", "in_progress")


def test_a_denied_approval_names_the_approval_presented() -> None:
    refusal = refusal_for(ActionDenied("approval_denied"), approval="apr_9")
    assert (refusal.outcome, refusal.reason, refusal.request_id) == (
        "approval_invalid",
        "approval_denied",
        "apr_9",
    )
    # Any other denial ignores the header: nothing was presented that matters.
    assert refusal_for(ActionDenied("deny_rule"), approval="apr_9").request_id is None


@pytest.mark.parametrize(
    "exc", [KeyError("bug"), RuntimeError("secret sk_live_123"), ZeroDivisionError()]
)
def test_unknown_exceptions_fail_closed_and_say_only_their_type(exc: Exception) -> None:
    refusal = refusal_for(exc, action="k8s.scale")
    assert (refusal.outcome, refusal.reason) == ("unavailable", "internal_error")
    assert refusal.message == f"internal error ({type(exc).__name__})"
    assert refusal.receipt_id is None


def test_a_subclass_without_a_row_takes_its_parents() -> None:
    class Newer(StoreError):
        pass

    assert refusal_for(Newer("x")).reason == "store_unavailable"


def test_messages_over_http_name_the_header_not_the_sdk() -> None:
    refusal = refusal_for(ApprovalRequired("apr_7"), action="stripe.refund")
    assert refusal.message == "stripe.refund needs approval apr_7"
    assert "with_approval" not in refusal.message
    assert refusal_for(StoreError("gone")).message == (
        "the ledger cannot be reached; nothing was sent (gone)"
    )
