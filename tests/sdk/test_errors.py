"""The exception tree: one base, ``receipt_id=`` on every constructor, the reference's order."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sdk_support import receipts

import ctrlrun
import ctrlrun.identity
import ctrlrun.reconcile
import ctrlrun.store
from ctrlrun import (
    Action,
    ActionDenied,
    ActionFrozen,
    AmbiguousEffect,
    ApprovalMismatch,
    ApprovalRequired,
    BudgetExceeded,
    Control,
    CTRLRunError,
    DuplicateEffect,
    Principal,
    SQLiteStateStore,
)
from ctrlrun.errors import (
    ApprovalTimeout,
    EffectKeyError,
    InvalidArgument,
    MissingDependency,
    NotExecuted,
    OutcomeUnknown,
    PolicyError,
    SchemaMismatch,
    StoreError,
)

ROOT = Path(__file__).resolve().parents[2]

# How to build each class with the fewest arguments (all else by keyword).
BUILD: dict[type[CTRLRunError], Callable[..., CTRLRunError]] = {
    CTRLRunError: lambda **kw: CTRLRunError("x", **kw),
    InvalidArgument: lambda **kw: InvalidArgument("x", **kw),
    PolicyError: lambda **kw: PolicyError("x", **kw),
    EffectKeyError: lambda **kw: EffectKeyError("x", **kw),
    ActionDenied: lambda **kw: ActionDenied("decision", **kw),
    ActionFrozen: lambda **kw: ActionFrozen("frozen by alice: incident", **kw),
    BudgetExceeded: lambda **kw: BudgetExceeded("refund: 10 of 1000 left", **kw),
    ApprovalRequired: lambda **kw: ApprovalRequired("apr_1", **kw),
    ApprovalMismatch: lambda **kw: ApprovalMismatch("consumed", **kw),
    ApprovalTimeout: lambda **kw: ApprovalTimeout("apr_1", **kw),
    DuplicateEffect: lambda **kw: DuplicateEffect(state="committed", effect_key="k", **kw),
    AmbiguousEffect: lambda **kw: AmbiguousEffect("k", **kw),
    NotExecuted: lambda **kw: NotExecuted("x", **kw),
    StoreError: lambda **kw: StoreError("x", **kw),
    SchemaMismatch: lambda **kw: SchemaMismatch("x", **kw),
    OutcomeUnknown: lambda **kw: OutcomeUnknown("x", **kw),
    MissingDependency: lambda **kw: MissingDependency("psycopg", "postgres", **kw),
    ctrlrun.store.NoLedger: lambda **kw: ctrlrun.store.NoLedger("x", **kw),
    ctrlrun.store.ConnectionLost: lambda **kw: ctrlrun.store.ConnectionLost("x", **kw),
    ctrlrun.identity.LedgerLost: lambda **kw: ctrlrun.identity.LedgerLost("x", **kw),
    ctrlrun.reconcile.NotAmbiguous: lambda **kw: ctrlrun.reconcile.NotAmbiguous("x", **kw),
}


def every_error_class() -> set[type[CTRLRunError]]:
    found: set[type[CTRLRunError]] = set()
    todo: list[type[CTRLRunError]] = [CTRLRunError]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("ctrlrun.") and not cls.__module__.startswith(
            ("ctrlrun.proxy", "ctrlrun.reconcilers")
        ):
            found.add(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_the_table_names_every_kernel_error() -> None:
    assert every_error_class() == set(BUILD)


@pytest.mark.parametrize("cls", sorted(BUILD, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_receipt_id_is_a_keyword_of_every_constructor(cls: type[CTRLRunError]) -> None:
    assert BUILD[cls]().receipt_id is None
    exc = BUILD[cls](receipt_id="ctr_1")
    assert isinstance(exc, cls) and exc.receipt_id == "ctr_1"
    assert str(exc)
    param = inspect.signature(cls).parameters.get("receipt_id")
    if cls.__init__ is not CTRLRunError.__init__:
        assert param is not None and param.kind is param.KEYWORD_ONLY, cls


def test_duplicate_effect_takes_its_arguments_as_the_reference_does() -> None:
    params = inspect.signature(DuplicateEffect).parameters
    assert list(params)[:3] == ["message", "state", "effect_key"]
    assert params["message"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert params["state"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["effect_key"].default is None
    exc = DuplicateEffect("already done", state="committed", effect_key="refund:p1")
    assert str(exc) == "already done"
    assert (exc.state, exc.effect_key) == ("committed", "refund:p1")
    with pytest.raises(TypeError):
        DuplicateEffect("committed", "refund:p1")  # type: ignore[misc]
    default = DuplicateEffect(state="in_progress", effect_key="k", action_id="act_1")
    assert str(default) == "effect 'k' is executing under act_1"


def test_no_raiser_sets_receipt_id_after_construction() -> None:
    assignment = re.compile(r"\.receipt_id\s*=(?!=)")
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in ("sdk", "proxy", "reconcilers")
        for path in (ROOT / folder).rglob("*.py")
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if assignment.search(line) and "self.receipt_id" not in line
    ]
    assert offenders == []


POLICY = """\
schema: ctrlrun.policy/v2
actions:
  refund: {effect: "refund:{payment_id}", decision: allow}
  delete: {decision: deny}
  wire: {decision: approve}
"""


@pytest.mark.parametrize(
    ("setup", "call", "error"),
    [
        ("none", ("delete", {}, None, None), ActionDenied),
        ("committed", ("refund", {"payment_id": "p1"}, "refund:p1", None), DuplicateEffect),
        ("ambiguous", ("refund", {"payment_id": "p1"}, "refund:p1", None), AmbiguousEffect),
        ("none", ("wire", {}, None, "apr_" + "0" * 32), ApprovalMismatch),
    ],
    ids=["denied", "duplicate", "ambiguous", "approval_mismatch"],
)
def test_a_refusal_names_the_receipt_that_records_it(
    store: SQLiteStateStore, setup: str, call: tuple[Any, ...], error: type[CTRLRunError]
) -> None:
    control = Control(ctrlrun.Policy.from_yaml(POLICY), store)
    bot = Principal("bot")
    first = Action("refund", {"payment_id": "p1"}, bot)
    if setup == "committed":
        control.execute(first, lambda: None, "refund:p1")
    elif setup == "ambiguous":
        control.finish(control.begin(first, "refund:p1"), "ambiguous", error="lost")
    name, arguments, key, approval = call
    with pytest.raises(error) as info:
        control.begin(Action(name, arguments, bot), key, approval_id=approval)
    assert info.value.receipt_id == receipts(store)[-1]["receipt_id"]


def test_approval_required_has_no_receipt(store: SQLiteStateStore) -> None:
    control = Control(ctrlrun.Policy.from_yaml(POLICY), store)
    with pytest.raises(ApprovalRequired) as info:
        control.begin(Action("wire", {}, Principal("bot")), None)
    assert info.value.receipt_id is None and receipts(store) == []
