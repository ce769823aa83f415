"""``@protect`` on ``def`` functions: arguments, principals, templates, tokens, defaults."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sdk_support import POLICY, events, receipts

import ctrlrun
import ctrlrun.defaults
from ctrlrun import (
    ActionDenied,
    Control,
    DuplicateEffect,
    EffectKeyError,
    InvalidArgument,
    SQLiteStateStore,
    context,
    idempotency_token,
    protect,
)
from ctrlrun.context import idempotency_token_for

BOT = ctrlrun.Principal("bot")


def test_returns_the_value_and_runs_once(control: Control, store: SQLiteStateStore) -> None:
    runs: list[tuple[str, int]] = []

    @protect("refund", control=control)
    def refund(payment_id: str, amount: int) -> dict[str, Any]:
        runs.append((payment_id, amount))
        return {"id": f"re_{payment_id}"}

    with context("bot"):
        assert refund("p1", 100) == {"id": "re_p1"}
        with pytest.raises(DuplicateEffect):
            refund(payment_id="p1", amount=100)
        assert refund("p2", amount=100) == {"id": "re_p2"}
    assert runs == [("p1", 100), ("p2", 100)]
    assert [r["effect_key"] for r in receipts(store)] == ["refund:p1", "refund:p1", "refund:p2"]


def test_called_with_canonical_copies_and_defaults(
    control: Control, store: SQLiteStateStore
) -> None:
    seen: list[Any] = []

    @protect("note", control=control)
    def note(meta: dict[str, Any], /, tags: tuple[str, ...], level: int = 3) -> None:
        meta["mutated"] = True
        seen.extend([meta, tags, level])

    caller_meta = {"a": [1]}
    with context("bot"):
        note(caller_meta, ("x", "y"))
    assert caller_meta == {"a": [1]}
    assert seen == [{"a": [1], "mutated": True}, ["x", "y"], 3]
    assert receipts(store)[0]["arguments"] == {"meta": {"a": [1]}, "tags": ["x", "y"], "level": 3}


def test_no_principal_denied_without_receipt(
    control: Control, store: SQLiteStateStore, caplog: pytest.LogCaptureFixture
) -> None:
    @protect("refund", control=control)
    def refund(payment_id: str, amount: int) -> None:
        pytest.fail("ran without a principal")

    with caplog.at_level(logging.WARNING, logger="ctrlrun"), pytest.raises(ActionDenied) as info:
        refund("p1", 100)
    assert info.value.reason == "no_principal"
    assert "refund" in caplog.text
    assert receipts(store) == [] and events(store) == []


@pytest.mark.parametrize(
    "kwargs",
    [{"amount": 1.5}, {"amount": 1, "meta": {"rate": 0.5}}, {"amount": 1, "meta": {"l": [[2.0]]}}],
    ids=["top", "nested", "deeply_nested"],
)
def test_float_argument_refused(
    control: Control, store: SQLiteStateStore, kwargs: dict[str, Any]
) -> None:
    @protect("refund", control=control)
    def refund(payment_id: str, amount: Any, meta: Any = None) -> None:
        pytest.fail("ran with a float")

    with context("bot"), pytest.raises(InvalidArgument, match="float"):
        refund(payment_id="p1", **kwargs)
    assert receipts(store) == []


def test_effect_key_error_is_denied_with_receipt(control: Control, store: SQLiteStateStore) -> None:
    @protect("refund", effect="refund:{payment_id}", control=control)
    def refund(payment_id: Any, amount: int) -> None:
        pytest.fail("ran without an effect key")

    with context("bot"), pytest.raises(EffectKeyError):
        refund(None, 5)
    (doc,) = receipts(store)
    assert doc["result"] == "denied" and doc["decision_reason"] == "effect_key_error"
    assert doc["effect_key"] is None
    assert [t for t, _ in events(store)] == ["ACTION_PROPOSED", "ACTION_DENIED"]


def test_decorator_effect_wins_over_policy(
    control: Control, store: SQLiteStateStore, caplog: pytest.LogCaptureFixture
) -> None:
    @protect("refund", effect="r:{payment_id}:{amount}", control=control)
    def refund(payment_id: str, amount: int) -> None:
        pass

    with caplog.at_level(logging.WARNING, logger="ctrlrun"), context("bot"):
        refund("p1", 1)
        refund("p1", 2)
    assert [r["effect_key"] for r in receipts(store)] == ["r:p1:1", "r:p1:2"]
    assert caplog.text.count("overrides policy effect") == 1


def test_resource_template(control: Control, store: SQLiteStateStore) -> None:
    @protect("note", effect="note:{resource}", resource="acct:{account}", control=control)
    def note(account: str) -> None:
        pass

    with context("bot"):
        note("42")
    (doc,) = receipts(store)
    assert doc["resource"] == "acct:42" and doc["effect_key"] == "note:acct:42"


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"name": ""}, "non-empty action name"),
        ({"name": "x", "effect": "k:{a"}, "effect template"),
        ({"name": "x", "resource": "{}"}, "resource template"),
        ({"name": "x", "reconcile": "not callable"}, "reconcile must be callable"),
        ({"name": "x", "lease": timedelta(0)}, "lease"),
        ({"name": "x", "lease": 30}, "lease"),
    ],
    ids=["empty_name", "bad_effect", "bad_resource", "reconcile", "zero_lease", "int_lease"],
)
def test_decoration_time_checks(kwargs: dict[str, Any], fragment: str) -> None:
    name = kwargs.pop("name")
    with pytest.raises(InvalidArgument, match=fragment):
        protect(name, **kwargs)


@pytest.mark.parametrize("variadic", ["args", "kwargs"])
def test_variadic_parameters_refused(variadic: str) -> None:
    def f_args(*args: Any) -> None: ...

    def f_kwargs(**kwargs: Any) -> None: ...

    with pytest.raises(InvalidArgument, match="nameable"):
        protect("x")(f_args if variadic == "args" else f_kwargs)


@pytest.mark.parametrize(
    ("key", "attempt", "token"),
    [
        ("refund:txn_1", 1, "382ee448-97da-8107-b674-8c253650d93f"),
        ("refund:txn_1", 2, "28bb40af-814c-8fb6-ba63-e8663b1c036d"),
        ("refund:txn_2", 1, "89977bc9-d128-8ae8-871f-f5265155e60f"),
    ],
)
def test_idempotency_token_vectors(key: str, attempt: int, token: str) -> None:
    assert idempotency_token_for(key, attempt) == token


@pytest.mark.parametrize(("key", "attempt"), [("", 1), ("k", 0), ("k", True), ("k", "1")])
def test_idempotency_token_for_refuses(key: str, attempt: Any) -> None:
    with pytest.raises(InvalidArgument):
        idempotency_token_for(key, attempt)


def test_idempotency_token_only_inside_a_keyed_attempt(control: Control) -> None:
    seen: list[str] = []

    @protect("refund", control=control)
    def refund(payment_id: str, amount: int) -> None:
        seen.append(idempotency_token())

    @protect("note", control=control)
    def note(text: str) -> None:
        idempotency_token()

    with pytest.raises(InvalidArgument):
        idempotency_token()
    with context("bot"):
        refund("txn_1", 5)
        with pytest.raises(InvalidArgument):
            note("no effect key")
    assert seen == ["382ee448-97da-8107-b674-8c253650d93f"]
    with pytest.raises(InvalidArgument):
        idempotency_token()


def test_default_control_from_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ctrlrun.yaml").write_text(POLICY, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    for var in ("CTRLRUN_CONFIG", "CTRLRUN_STORE_URL", "CTRLRUN_STATE", "CTRLRUN_ENVIRONMENT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(ctrlrun.defaults, "_default", None)

    @protect("refund")
    def refund(payment_id: str, amount: int) -> str:
        return "ok"

    assert not (tmp_path / ".ctrlrun").exists()  # nothing built before the first call
    with context("bot"):
        assert refund("p1", 5) == "ok"
        with pytest.raises(DuplicateEffect):
            refund("p1", 5)
    default = ctrlrun.defaults._default
    assert default is not None
    assert (tmp_path / ".ctrlrun" / "state.db").exists()
    default.store.close()


README_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    resource: "payment:{payment_id}"
    decision: allow
  keyed_by_resource:
    effect: "k:{resource}"
    resource: "acct:{account}"
    decision: allow
"""


def test_the_policy_resource_template_is_applied(
    make_control: Any, store: SQLiteStateStore
) -> None:
    """The README's policy reference names a resource: it is part of the action (and hash)."""
    control = make_control(README_POLICY)

    @protect("stripe.refund", control=control)
    def refund(payment_id: str, amount: int) -> None:
        pass

    @protect("keyed_by_resource", control=control)
    def note(account: str) -> None:
        pass

    with context("bot"):
        refund("pi_123", 5000)
        note("42")  # an effect template naming {resource} resolves from the policy's resource
        with pytest.raises(DuplicateEffect):
            note("42")
    first, second, _ = receipts(store)
    assert first["resource"] == "payment:pi_123" and first["effect_key"] == "refund:pi_123"
    assert second["resource"] == "acct:42" and second["effect_key"] == "k:acct:42"
    plain = ctrlrun.Action("stripe.refund", {"payment_id": "pi_123", "amount": 5000}, BOT)
    assert first["action_hash"] != plain.hash  # the resource is hashed with the action


def test_a_policy_resource_naming_a_missing_argument_is_invalid(
    make_control: Any, store: SQLiteStateStore
) -> None:
    control = make_control(README_POLICY)

    @protect("stripe.refund", control=control)
    def refund(charge: str) -> None:
        pytest.fail("ran without its resource")

    with context("bot"), pytest.raises(InvalidArgument, match="resource"):
        refund("ch_1")
    assert receipts(store) == []


def test_control_builds_actions_with_the_policy_resource(make_control: Any) -> None:
    control = make_control(README_POLICY)
    action = control.action("stripe.refund", {"payment_id": "pi_9", "amount": 1}, BOT)
    assert action.resource == "payment:pi_9" and action.environment == control.environment
    assert control.action("unknown", {"a": 1}, BOT).resource is None
    with pytest.raises(InvalidArgument, match="float"):
        control.action("stripe.refund", {"payment_id": "pi_9", "amount": 1.5}, BOT)


def test_each_warning_is_said_once_per_function(
    make_control: Any, caplog: pytest.LogCaptureFixture
) -> None:
    control = make_control(README_POLICY + "  note: {decision: allow}\n")

    @protect(
        "stripe.refund", effect="r:{payment_id}:{amount}", resource="p:{amount}", control=control
    )
    def refund(payment_id: str, amount: int) -> None:
        pass

    @protect("note", reconcile=lambda key: "unknown", control=control)
    def note(text: str) -> None:
        pass

    with caplog.at_level(logging.WARNING, logger="ctrlrun"), context("bot"):
        for i in range(3):
            refund("p1", i)
            note(str(i))
    assert caplog.text.count("overrides policy effect") == 1
    assert caplog.text.count("overrides policy resource") == 1
    assert caplog.text.count("reconcile hook given but the action has no effect key") == 1


def _shapes(a: int, /, b: str, c: int = 3, *, d: bool = False, e: str = "e") -> None: ...


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((1, "b"), {}),
        ((1, "b", 4), {}),
        ((1,), {"b": "b"}),
        ((1,), {"e": "x", "b": "b", "d": True}),
        ((1, "b"), {"c": 5}),
        # calls that do not fit: the same TypeError as Signature.bind's
        ((), {}),
        ((1,), {}),
        ((1, "b", 4, 5), {}),
        ((1, "b"), {"b": "again"}),
        ((1, "b"), {"a": 1}),
        ((1, "b"), {"zz": 1}),
    ],
)
def test_arguments_are_named_as_signature_bind_names_them(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    import inspect

    from ctrlrun.protect import _Binder

    signature = inspect.signature(_shapes)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        with pytest.raises(TypeError, match=str(exc)):
            _Binder(signature).bind(args, kwargs)
        return
    bound.apply_defaults()
    got = _Binder(signature).bind(args, kwargs)
    assert list(got.items()) == list(bound.arguments.items())  # the same names, in order


def test_a_call_that_does_not_fit_raises_type_error_and_records_nothing(
    control: Control, store: SQLiteStateStore
) -> None:
    @protect("refund", control=control)
    def refund(payment_id: str, amount: int) -> None:
        pytest.fail("ran with arguments that do not fit")

    with context("bot"), pytest.raises(TypeError):
        refund("p1", 100, 7)  # type: ignore[call-arg]
    assert receipts(store) == [] and events(store) == []


def test_scalar_arguments_are_passed_as_given_and_others_as_copies(
    control: Control, store: SQLiteStateStore
) -> None:
    seen: list[Any] = []

    @protect("note", control=control)
    def note(text: str, /, count: int, flag: bool, nothing: None, items: list[int]) -> None:
        seen.extend([text, count, flag, nothing, items])

    items = [1, 2]
    with context("bot"):
        note("hi", 2, flag=True, nothing=None, items=items)
    assert seen == ["hi", 2, True, None, [1, 2]] and seen[4] is not items
