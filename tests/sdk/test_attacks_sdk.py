"""Ways around ``@ctrlrun.protect``: values that mean one thing to the remote but name two
effect keys, functions whose body runs after the record is written, evidence that is not
about the call it is recorded for, and exception text that carries a credential."""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any

import pytest
from sdk_support import events, receipts
from sqlalchemy import text

from ctrlrun import (
    AmbiguousEffect,
    Control,
    DuplicateEffect,
    InvalidArgument,
    NotExecuted,
    SQLiteStateStore,
    context,
    protect,
)

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  refund:
    effect: "refund:{payment_id}"
    decision: allow
  scale:
    effect: "scale:{replicas}"
    decision: allow
  transfer:
    effect: "transfer:{transfer_id}"
    decision: allow
  notify:
    effect: "notify:{transfer_id}"
    decision: allow
"""


def states(store: SQLiteStateStore) -> dict[str, tuple[str, int]]:
    with store.reading() as conn:
        rows = conn.execute(text("SELECT effect_key, state, attempt FROM effects")).all()
    return {k: (s, a) for k, s, a in rows}


class Payment(str, enum.Enum):  # noqa: UP042 (a StrEnum's str() is its value; this one's is not)
    P1 = "pi_1"


class Replicas(int, enum.Enum):
    SIX = 6


class Tagged(str):
    """A str subclass whose text is the remote's value but whose str() is not."""

    def __str__(self) -> str:
        return f"<{self.upper()}>"


# -- one value, two effect keys ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "field", "fancy", "plain"),
    [
        ("refund", "payment_id", Payment.P1, "pi_1"),
        ("refund", "payment_id", Tagged("pi_1"), "pi_1"),
        ("scale", "replicas", Replicas.SIX, 6),
    ],
    ids=["str-enum", "str-subclass", "int-enum"],
)
def test_an_enum_or_subclass_names_the_same_effect_as_its_plain_value(
    make_control: Callable[..., Control],
    store: SQLiteStateStore,
    action: str,
    field: str,
    fancy: Any,
    plain: Any,
) -> None:
    ctl = make_control(POLICY)
    seen: list[Any] = []

    def body(**kwargs: Any) -> str:
        seen.append(kwargs[field])
        return "done"

    fn = protect(action, control=ctl)(_one_arg(field, body))
    with context("bot"):
        assert fn(fancy) == "done"
        with pytest.raises(DuplicateEffect):
            fn(plain)  # the remote saw the very same value: this is a duplicate
    assert seen == [plain] and [type(v) for v in seen] == [type(plain)]
    assert [(r["effect_key"], r["result"]) for r in receipts(store)] == [
        (f"{action}:{plain}", "committed"),
        (f"{action}:{plain}", "blocked"),
    ]


def _one_arg(field: str, body: Callable[..., Any]) -> Callable[..., Any]:
    if field == "payment_id":

        def refund(payment_id: Any) -> Any:
            return body(payment_id=payment_id)

        return refund

    def scale(replicas: Any) -> Any:
        return body(replicas=replicas)

    return scale


# -- a body that runs after its record was written -----------------------------------------------


def test_a_generator_function_is_refused_at_decoration(control: Control) -> None:
    def refunds(payment_id: str) -> Iterator[int]:
        yield 1

    async def arefunds(payment_id: str) -> AsyncIterator[int]:
        yield 1

    for fn in (refunds, arefunds):
        with pytest.raises(InvalidArgument, match="generator"):
            protect("refund", control=control)(fn)


def test_a_def_that_returns_an_awaitable_is_ambiguous_and_the_awaitable_never_runs(
    make_control: Callable[..., Control], store: SQLiteStateStore
) -> None:
    control = make_control(POLICY)
    ran: list[str] = []

    async def send(payment_id: str) -> str:
        ran.append(payment_id)
        return "sent"

    @protect("refund", control=control)
    def refund(payment_id: str) -> Coroutine[Any, Any, str]:
        return send(payment_id)  # the effect would happen later, outside the protection

    with context("bot"):
        with pytest.raises(InvalidArgument, match="awaitable"):
            refund("pi_9")
        with pytest.raises(AmbiguousEffect):
            refund("pi_9")
    assert ran == []
    assert states(store) == {"refund:pi_9": ("ambiguous", 1)}


def test_an_async_def_that_returns_an_awaitable_is_ambiguous(
    make_control: Callable[..., Control], store: SQLiteStateStore
) -> None:
    control = make_control(POLICY)
    ran: list[str] = []

    async def send(payment_id: str) -> str:
        ran.append(payment_id)
        return "sent"

    @protect("refund", control=control)
    async def refund(payment_id: str) -> Any:
        return send(payment_id)

    async def main() -> None:
        with context("bot"), pytest.raises(InvalidArgument, match="awaitable"):
            await refund("pi_8")

    asyncio.run(main())
    assert ran == []
    assert states(store) == {"refund:pi_8": ("ambiguous", 1)}


# -- evidence about another call ---------------------------------------------------------------


def test_not_executed_of_a_nested_protected_call_is_not_evidence_for_the_outer_one(
    make_control: Callable[..., Control], store: SQLiteStateStore
) -> None:
    ctl = make_control(POLICY)
    debits: list[str] = []

    @protect("notify", control=ctl)
    def notify(transfer_id: str) -> None:
        raise NotExecuted("mail server refused the connection")

    @protect("transfer", control=ctl)
    def transfer(transfer_id: str) -> None:
        debits.append(transfer_id)  # the outer remote acted
        notify(transfer_id)  # then the inner call certainly did nothing

    with context("bot"):
        with pytest.raises(NotExecuted):
            transfer("t1")
        with pytest.raises(AmbiguousEffect):
            transfer("t1")  # a retry must not debit again
    assert debits == ["t1"]
    assert states(store) == {"transfer:t1": ("ambiguous", 1), "notify:t1": ("failed", 1)}


def test_not_executed_raised_by_the_function_itself_still_fails_it(
    make_control: Callable[..., Control], store: SQLiteStateStore
) -> None:
    ctl = make_control(POLICY)

    @protect("transfer", control=ctl)
    def transfer(transfer_id: str) -> None:
        raise NotExecuted("bank refused the connection")

    with context("bot"), pytest.raises(NotExecuted):
        transfer("t2")
    assert states(store) == {"transfer:t2": ("failed", 1)}


# -- secrets in exception text ---------------------------------------------------------------

SECRETS = {
    "stripe": "sk_live_51AbCdEfGhIjKlMnOpQrStUv",
    "bearer": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJib3QifQ.c2lnbmF0dXJlLXNlY3JldA",
    "password": "hunter2-s3cret",
    "query": "q-9f8e7d6c5b4a",
    "github": "ghp_0123456789abcdefghijABCDEFGHIJ012345",
}
MESSAGES = [
    f"401 for url 'https://api.example.com/v1/refunds?api_key={SECRETS['query']}&x=1'",
    f"Invalid API Key provided: {SECRETS['stripe']}",
    f"sent Authorization: Bearer {SECRETS['bearer']} and got 403",
    f"could not connect to postgresql://app:{SECRETS['password']}@db.internal/app",
    f"push refused for token {SECRETS['github']}",
]


@pytest.mark.parametrize("message", MESSAGES)
def test_a_secret_in_an_exception_reaches_no_record_and_no_log_line(
    control: Control,
    store: SQLiteStateStore,
    message: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def hook(key: str) -> Any:
        raise RuntimeError(f"reconciler: {message}")

    @protect("refund", control=control, reconcile=hook, reconcile_eagerly=True)
    def refund(payment_id: str, amount: int) -> None:
        raise ConnectionError(message)

    @protect("refund", control=control)
    def refund_not_executed(payment_id: str, amount: int) -> None:
        raise NotExecuted(message)

    caplog.set_level(logging.DEBUG)
    with context("bot"):
        with pytest.raises(ConnectionError):
            refund("pi_s", 100)
        with pytest.raises(NotExecuted):
            refund_not_executed("pi_t", 100)
    with store.reading() as conn:
        tables = ("effects", "events", "receipts")
        dumped = " ".join(
            " ".join(map(str, row))
            for t in tables
            for row in conn.execute(text(f"SELECT * FROM {t}")).all()
        )
    logged = "\n".join(r.getMessage() for r in caplog.records)
    leaked = [name for name, s in SECRETS.items() if s in dumped or s in logged]
    assert not leaked, (leaked, dumped)
    errors = [r["error"] for r in receipts(store)]
    assert errors[0].startswith("ConnectionError: ") and errors[1].startswith("NotExecuted: ")
    assert any(data.get("reason") == "raised" for _, data in events(store, "refund:pi_s"))
