"""One store boundary: every driver error becomes ``StoreError`` where it enters the kernel.

The unit half lists the drivers' exception classes (every subclass of ``sqlite3.Error`` and
``psycopg.Error``, and both DB-API ``Warning`` classes) and proves each maps, chained with
``from``; the other half makes real statements fail on each engine (a trigger refusing the
insert) on the raw-SQL fast path, and checks that ``@protect`` raises ``StoreError``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError as SAIntegrityError

from ctrlrun import Control, CTRLRunError, Policy, StoreError, context, protect
from ctrlrun.driver_errors import map_driver_errors
from ctrlrun.errors import AmbiguousEffect, InvalidArgument
from ctrlrun.store import StateStore


def subclasses(root: type[BaseException]) -> list[type[BaseException]]:
    found, todo = [root], [root]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.append(sub)
                todo.append(sub)
    return found


SQLITE = [*subclasses(sqlite3.Error), sqlite3.Warning]
PSYCOPG = [*subclasses(psycopg.Error), psycopg.Warning]


def test_the_lists_are_the_drivers_whole_trees() -> None:
    assert {sqlite3.IntegrityError, sqlite3.OperationalError, sqlite3.ProgrammingError} <= set(
        SQLITE
    )
    assert len(SQLITE) >= 10
    import psycopg.errors as pe

    assert {pe.UniqueViolation, pe.LockNotAvailable, pe.QueryCanceled, pe.AdminShutdown} <= set(
        PSYCOPG
    )
    assert len(PSYCOPG) > 200  # one class per SQLSTATE


def build(cls: type[BaseException]) -> BaseException:
    return cls("the database said no\nsecond line")


@pytest.mark.parametrize("cls", SQLITE + PSYCOPG, ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_every_driver_error_maps_to_store_error(cls: type[BaseException]) -> None:
    original = build(cls)
    with pytest.raises(StoreError) as info, map_driver_errors("ledger at x"):
        raise original
    assert info.value.__cause__ is original
    assert str(info.value) == "ledger at x: the database said no"


def test_sqlalchemy_wrapped_errors_map_to_the_drivers_message() -> None:
    orig = sqlite3.IntegrityError("UNIQUE constraint failed: effects.effect_key")
    wrapped = SAIntegrityError("INSERT …", {}, orig)
    with (
        pytest.raises(StoreError, match="x: UNIQUE constraint failed") as info,
        map_driver_errors("x"),
    ):
        raise wrapped
    assert info.value.__cause__ is wrapped


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("not the database"),
        InvalidArgument("a kernel error"),
        AmbiguousEffect("k"),
        StoreError("already mapped"),
        KeyboardInterrupt(),
        asyncio.CancelledError(),
    ],
    ids=lambda e: type(e).__name__,
)
def test_everything_else_passes_through_unchanged(exc: BaseException) -> None:
    with pytest.raises(type(exc)) as info, map_driver_errors("x"):
        raise exc
    assert info.value is exc


POLICY = """\
schema: ctrlrun.policy/v2
actions:
  refund: {effect: "refund:{payment_id}", decision: allow}
  deny_me: {decision: deny}
"""

# A trigger that refuses every insert into one table, on each engine.
SQLITE_TRIGGER = (
    "CREATE TRIGGER refuse_{table} BEFORE INSERT ON {table} "
    "BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END"
)
PG_TRIGGER = [
    "CREATE FUNCTION refuse_{table}() RETURNS trigger LANGUAGE plpgsql AS "
    "$$ BEGIN RAISE EXCEPTION 'refused by a trigger'; END $$",
    "CREATE TRIGGER refuse_{table} BEFORE INSERT ON {table} "
    "FOR EACH ROW EXECUTE FUNCTION refuse_{table}()",
]


def refuse_inserts(store: StateStore, table: str) -> None:
    statements = [SQLITE_TRIGGER] if store.dialect == "sqlite" else PG_TRIGGER
    with store.transaction() as conn:
        for sql in statements:
            conn.execute(text(sql.format(table=table)))


def driver_base(store: StateStore) -> type[BaseException]:
    return sqlite3.Error if store.dialect == "sqlite" else psycopg.Error


@pytest.mark.parametrize("table", ["effects", "events", "receipts"])
def test_a_failing_insert_makes_protect_raise_store_error(store: StateStore, table: str) -> None:
    """Each table is written on the raw-SQL fast path: the reservation, its events, a receipt."""
    control = Control(Policy.from_yaml(POLICY), store)
    runs: list[str] = []

    @protect("refund", control=control)
    def refund(payment_id: str) -> None:
        runs.append(payment_id)

    @protect("deny_me", control=control)
    def denied() -> None:
        runs.append("denied")

    refuse_inserts(store, table)
    with context("bot"):
        call: Any = denied if table == "receipts" else (lambda: refund("p1"))
        with pytest.raises(StoreError, match="refused by a trigger") as info:
            call()
    assert isinstance(info.value.__cause__, driver_base(store))
    assert not isinstance(info.value, sqlite3.Error | psycopg.Error)
    assert isinstance(info.value, CTRLRunError)
    assert runs == []  # nothing ran without its record
    with store.reading() as conn:
        assert conn.execute(text("SELECT count(*) FROM effects")).scalar() == 0


def test_a_failing_insert_in_async_protect_is_store_error(store: StateStore) -> None:
    control = Control(Policy.from_yaml(POLICY), store)

    @protect("refund", control=control)
    async def refund(payment_id: str) -> None:
        raise AssertionError("ran without a record")

    refuse_inserts(store, "effects")

    async def main() -> None:
        with context("bot"), pytest.raises(StoreError) as info:
            await refund("p1")
        assert isinstance(info.value.__cause__, driver_base(store))

    asyncio.run(main())
