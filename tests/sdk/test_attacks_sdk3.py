"""Two calls the remote reads as one action must name one effect key: a spelling the remote
trims or normalizes is refused before it acts, and every way of passing the same arguments
(by name or position, defaulted, through a partial, a bound method or a classmethod) names
the same key as the plain call."""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Callable
from typing import Any

import pytest
from sdk_support import receipts

from ctrlrun import (
    Control,
    DuplicateEffect,
    EffectKeyError,
    InvalidArgument,
    SQLiteStateStore,
    context,
    protect,
)

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  refund:
    effect: "refund:{payment_id}"
    resource: "customer:{customer}"
    decision: allow
"""

CAFE = "caf\u00e9"  # NFC


@pytest.mark.parametrize(
    ("plain", "other"),
    [
        (CAFE, unicodedata.normalize("NFD", CAFE)),
        ("pi_1", " pi_1"),
        ("pi_1", "pi_1 "),
        ("pi_1", "pi_1\n"),
        ("pi_1", "\tpi_1"),
        ("pi_1", "pi_1\x00"),
        ("pi_1", "pi\u200b_1"),
        ("pi_1", "pi_1\u00a0"),
        ("pi_1", "\ufeffpi_1"),
        ("pi_1", "\uff50\uff49_1"),  # fullwidth: NFKC is pi_1
        ("pi_1", "pi_1\u2028"),
    ],
    ids=[
        "nfd", "lead-space", "trail-space", "newline", "tab", "nul", "zero-width", "nbsp",
        "bom", "fullwidth", "line-sep",
    ],
)  # fmt: skip
def test_a_spelling_the_remote_reads_as_another_is_refused_before_it_acts(
    make_control: Callable[..., Control], store: SQLiteStateStore, plain: str, other: str
) -> None:
    ctl = make_control(POLICY)
    ran: list[str] = []

    @protect("refund", control=ctl)
    def refund(payment_id: str, customer: str = "c1") -> None:
        ran.append(payment_id)

    with context("bot"):
        refund(plain)
        with pytest.raises(EffectKeyError, match="payment_id") as caught:
            refund(other)  # a remote that trims or normalizes refunds `plain` again
        with pytest.raises(InvalidArgument, match="customer"):
            refund("pi_2", customer=other)  # the resource template too
    assert ran == [plain]
    assert "\n" not in str(caught.value) and "Traceback" not in str(caught.value)
    assert [r["result"] for r in receipts(store)] == ["committed", "denied"]


def test_plain_text_with_inner_spaces_and_composed_letters_still_runs(
    make_control: Callable[..., Control],
) -> None:
    ctl = make_control(POLICY)

    @protect("refund", control=ctl)
    def refund(payment_id: str, customer: str = "c1") -> str:
        return payment_id

    with context("bot"):
        assert refund("order 7 of Zoë", customer=CAFE) == "order 7 of Zoë"
        assert refund("注文-7") == "注文-7"


class Payments:
    def refund(self, payment_id: str, customer: str = "c1") -> str:
        return payment_id

    @classmethod
    def refund_cls(cls, payment_id: str, customer: str = "c1") -> str:
        return payment_id


def _refund(payment_id: str, customer: str = "c1") -> str:
    return payment_id


def _kw_only(*, payment_id: str, customer: str = "c1") -> str:
    return payment_id


@pytest.mark.parametrize(
    ("wrap", "call"),
    [
        (lambda: _refund, lambda f: f(payment_id="pi_1")),
        (lambda: _refund, lambda f: f("pi_1", "c1")),
        (lambda: _refund, lambda f: f(customer="c1", payment_id="pi_1")),
        (lambda: functools.partial(_refund, customer="c1"), lambda f: f("pi_1")),
        (lambda: functools.partial(_refund, payment_id="pi_1"), lambda f: f()),
        (lambda: Payments().refund, lambda f: f("pi_1")),
        (lambda: Payments.refund_cls, lambda f: f(payment_id="pi_1")),
        (lambda: _kw_only, lambda f: f(customer="c1", payment_id="pi_1")),
    ],
    ids=["by-name", "defaults-passed", "reordered", "partial", "partial-bound-key",
         "bound-method", "classmethod", "keyword-only"],
)  # fmt: skip
def test_every_way_of_passing_the_same_arguments_is_one_effect(
    make_control: Callable[..., Control],
    wrap: Callable[[], Callable[..., Any]],
    call: Callable[[Callable[..., Any]], Any],
) -> None:
    ctl = make_control(POLICY)
    first = protect("refund", control=ctl)(_refund)
    with context("bot"):
        assert first("pi_1") == "pi_1"
        with pytest.raises(DuplicateEffect, match="refund:pi_1"):
            call(protect("refund", control=ctl)(wrap()))


def test_a_method_protected_in_its_class_is_refused_with_one_line_and_never_runs(
    make_control: Callable[..., Control],
) -> None:
    ctl = make_control(POLICY)
    ran: list[str] = []

    class Service:
        @protect("refund", control=ctl)
        def refund(self, payment_id: str, customer: str = "c1") -> None:
            ran.append(payment_id)

    with context("bot"), pytest.raises(InvalidArgument, match="self") as caught:
        Service().refund("pi_1")
    assert ran == [] and "\n" not in str(caught.value)


def test_a_partial_that_hides_the_key_positionally_is_refused_and_never_runs(
    make_control: Callable[..., Control],
) -> None:
    ctl = make_control(POLICY)
    ran: list[str] = []

    def refund(payment_id: str, customer: str = "c1") -> None:
        ran.append(payment_id)

    hidden = protect("refund", control=ctl)(functools.partial(refund, "pi_1"))
    with context("bot"), pytest.raises(EffectKeyError, match="payment_id"):
        hidden()
    assert ran == []
