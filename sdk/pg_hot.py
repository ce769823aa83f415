"""PostgreSQL: a decision's statements combined, so each transaction is few round trips.

On SQLite a statement costs no round trip and these stay apart (``ledger.py``). On
PostgreSQL each statement waits for the server: taking a key and appending its events, or
moving a record to its outcome with its event and the receipt chain's next number, are one
data-modifying ``WITH`` each, whose later parts write only if the first one did (so a key
that was taken, or a record that moved, leaves nothing written and the caller goes the
statement-by-statement way).

A protected call is then four round trips: the key and its events, alone, as a transaction
of its own (no ``BEGIN``, no ``COMMIT``); ``BEGIN``; the outcome's move; the receipt and the
chain's head with the ``COMMIT`` in the same query (``ledger._run_committing``). The
outcome's receipt needs the chain position the move took, so it cannot go with the move.
A duplicate is five: the key tried, alone; ``BEGIN``; the record read; the refusal's events
with the chain's next number (``events_and_chain``); the receipt and the head with the
``COMMIT``. Every admission that writes a receipt ends with those last two.

Each write here notes in ``steady`` what ``ledger.insert_effect`` and ``ledger.move_effect``
note on SQLite (an attempt's start, its ambiguous outcome): without it a reconciler in this
process judged a settle window on PostgreSQL by the ledger's clock alone, so a step of the
database host's clock ended it early there (and not on SQLite).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection

from . import steady
from .driver_errors import one_line
from .errors import ConnectionLost
from .ledger import (
    _EVENT_COLUMNS,
    _event_params,
    _events_sql,
    _insert_effect_sql,
    _move_effect_sql,
    _run,
)
from .states import EffectState, check_transition

_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE: no transaction open on the connection


def insert_effect_with_events(
    conn: Connection,
    values: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    *,
    alone: bool = False,
) -> bool:
    """PostgreSQL, one round trip: ``insert_effect``, and only if the key was free, ``rows``
    (``event_row``s, at least one) appended. False: the key was taken, nothing written.

    ``alone``: the caller writes nothing more when the key was free. If nothing was sent in
    the transaction yet, the statement is then its own transaction (autocommit: no ``BEGIN``
    and ``COMMIT`` round trips; one statement is atomic), and the caller's COMMIT finds
    nothing to commit. When the key was taken, what the caller does next begins a new
    transaction; under READ COMMITTED each statement reads afresh, so it reads what it would
    have read in this one. A connection lost during the statement may have committed it
    (``ConnectionLost`` says so): the store's retry then finds the key taken by this
    reservation, under its lease, and refuses; if it had not, the retry takes the key.
    """
    check_transition(EffectState.NEW, EffectState(values["state"]))
    columns = tuple(sorted(values))
    params = {f"v_{c}": values[c] for c in columns}
    params.update({f"{c}_{i}": row[c] for i, row in enumerate(rows) for c in _EVENT_COLUMNS})
    sql = _reserve_sql(columns, len(rows))
    raw: Any = conn.connection.dbapi_connection
    if not alone or raw.info.transaction_status != _IDLE:
        taken = int(_run(conn, sql, params).rowcount) > 0
        return taken and steady.written(values["effect_key"], 1, values)
    raw.autocommit = True
    try:
        taken = int(_run(conn, sql, params).rowcount) > 0
        return taken and steady.written(values["effect_key"], 1, values)
    except Exception as exc:
        if raw.broken or raw.closed:  # not "nothing was written": the statement commits itself
            raise ConnectionLost(
                "the connection was lost during a reservation sent as its own transaction; "
                "if the server ran it, the retry finds the key taken under this call's lease "
                f"and refuses: {one_line(exc)}"
            ) from exc
        raise
    finally:
        if raw.info.transaction_status == _IDLE:  # else broken: discarded
            raw.autocommit = False


@functools.cache
def _reserve_sql(columns: tuple[str, ...], n: int) -> str:
    insert = _insert_effect_sql(columns).replace("(:", "(:v_").replace(", :", ", :v_")
    names = ", ".join(_EVENT_COLUMNS)
    values = _events_sql(n, False).split(" VALUES ", 1)[1]
    return (
        f"WITH ins AS ({insert} RETURNING 1) INSERT INTO events ({names}) "
        f"SELECT * FROM (VALUES {values}) AS v({names}) WHERE EXISTS (SELECT 1 FROM ins)"
    )


def move_with_event(
    conn: Connection,
    key: str,
    move: tuple[EffectState, EffectState, str, int],
    values: Mapping[str, Any],
    event: Mapping[str, Any],
) -> tuple[int, str, int] | None:
    """PostgreSQL, one round trip: the compare-and-set ``move`` (old, new, action_id,
    attempt), and only if it moved, ``event`` (an ``event_row``) appended and the receipt
    chain advanced. Returns (seq, previous hash, event id), or None when nothing moved."""
    old, new, action_id, attempt = move
    check_transition(old, new)
    params = {**values, "state": new.value}
    sql = _move_with_event_sql(tuple(sorted(params)))
    params.update(k_key=key, k_old=old.value, k_action_id=action_id, k_attempt=attempt)
    params.update({f"e_{c}": event[c] for c in _EVENT_COLUMNS})
    found = _run(conn, sql, params).fetchone()
    if found is None:
        return None
    steady.written(key, attempt, values, new is EffectState.AMBIGUOUS)  # as ledger.move_effect
    return int(found[0]), str(found[1]), int(found[2])


@functools.cache
def _move_with_event_sql(columns: tuple[str, ...]) -> str:
    moved = "EXISTS (SELECT 1 FROM moved)"
    values = ", ".join(f":e_{c}" for c in _EVENT_COLUMNS)
    return (
        f"WITH moved AS ({_move_effect_sql(columns)} RETURNING 1), "
        f"ev AS (INSERT INTO events ({', '.join(_EVENT_COLUMNS)}) SELECT {values} "
        f"WHERE {moved} RETURNING event_id) "
        f"UPDATE receipt_chain SET seq = seq + 1 WHERE id = 1 AND {moved} "
        "RETURNING seq, hash, (SELECT event_id FROM ev)"
    )


def events_and_chain(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> tuple[int, str, int]:
    """PostgreSQL, one round trip: ``rows`` (``event_row``s, at least one) appended and the
    receipt chain advanced, as ``append_events`` then ``advance_chain`` would. Returns (seq,
    previous hash, the last event's id), for the receipt written next."""
    params = {name: rows[i][c] for name, i, c in _event_params(len(rows))}
    found = _run(conn, _events_and_chain_sql(len(rows)), params).fetchone()
    return int(found[0]), str(found[1]), int(found[2])


@functools.cache
def _events_and_chain_sql(n: int) -> str:
    return (
        f"WITH ev AS ({_events_sql(n, True)}) "
        "UPDATE receipt_chain SET seq = seq + 1 WHERE id = 1 "
        "RETURNING seq, hash, (SELECT max(event_id) FROM ev)"
    )
