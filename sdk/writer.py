"""The one writer of admission plans: gather the facts, plan, apply, all in one transaction.

Every write a plan makes is conditional: the record's insert happens only if the key is free,
every later move is a compare-and-set on what was read. A write that finds the row moved
means another caller got there first; the transaction rolls back (nothing it wrote, an
approval consumed included, survives) and admission plans again from fresh facts, a bounded
number of times. Most keys are new, so the plan is first made as if the key had no record
and its insert is tried at once; the record is read only when that insert finds the key
taken (``admission`` guarantees that a plan made on ``record=None`` is otherwise final).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Connection

from . import budgets, holder, ledger, pg_hot, steady
from .action import iso
from .admission import attempt_of, plan_admission, wants_approval_row, wants_standing_approval
from .attempt import Attempt, attempt_receipt
from .errors import AmbiguousEffect
from .freeze import FreezeCache
from .heartbeat import as_seen_here
from .plan import (
    ConsumeBudget,
    Facts,
    InsertApproval,
    InsertEffect,
    MoveApproval,
    MoveEffect,
    Plan,
    Write,
)
from .receipts import Receipt
from .store import StateStore

log = logging.getLogger(__name__)
MAX_TRIES = 3


class LostRace(Exception):
    """A conditional write found the row moved: roll back and plan again."""


@dataclass(frozen=True)
class Admitted:
    """A plan that has been written: the attempt it left, and its receipt if it wrote one."""

    plan: Plan
    attempt: Attempt
    receipt: Receipt | None = None


def admit(store: StateStore, facts: Facts) -> Admitted:
    """Plan ``facts`` and write the plan in one transaction; re-plan on a lost race."""
    # A lease it takes names this process and ends on this host's monotonic clock too.
    facts = replace(facts, holder=holder.me(), steady_now=steady.monotonic())
    for _ in range(MAX_TRIES):
        try:
            return store.write(lambda conn: admit_on(conn, facts, store.freezes))
        except LostRace:
            log.debug("lost a race on %s; planning again", facts.effect_key)
    raise AmbiguousEffect(facts.effect_key or "", "the effect record kept moving; try again later")


def admit_on(conn: Connection, facts: Facts, freezes: FreezeCache | None = None) -> Admitted:
    """Plan and write on an open transaction (the caller commits, or rolls back on LostRace).

    ``freezes`` is the process's view of the kill switch; without one the table is read.
    """
    frozen = (freezes or FreezeCache(ttl=0)).active(conn, facts.action.name)
    if frozen is not None:
        facts = replace(facts, frozen=frozen.message)
    if facts.budget is not None:  # locked until commit: racers for the row queue, not lose
        spent = budgets.read_for_update(conn, facts.budget)
        facts = replace(facts, budget=replace(facts.budget, spent=spent))
    # After the budget's read: past its limit, ``over: approve`` asks for an approval.
    if facts.approval_id is not None and wants_approval_row(facts):
        facts = replace(facts, approval=ledger.approval_row(conn, facts.approval_id))
    elif facts.resend and wants_standing_approval(facts):
        row = ledger.granted_approval(conn, facts.action.hash, iso(facts.now))
        if row is not None:  # the identical action, approved: consumed as if presented
            facts = replace(facts, approval_id=row["approval_id"], approval=row)
        else:  # still waiting for its answer: the same request, not one more for operators
            pending = ledger.pending_request(conn, facts.action.hash, iso(facts.now))
            facts = replace(facts, pending_request=pending)
    plan = plan_admission(facts)
    writes = plan.writes
    logged = False  # the plan's events are written already
    if writes and isinstance(writes[0], InsertEffect):
        if _insert(conn, writes[0], facts, plan):
            writes = writes[1:]
            logged = (
                conn.dialect.name == "postgresql" and plan.receipt is None and bool(plan.events)
            )
        else:
            assert facts.effect_key is not None
            record = ledger.get_effect(conn, facts.effect_key)
            if record is None:  # pragma: no cover (the conflicting row cannot vanish)
                raise LostRace
            facts = replace(facts, record=as_seen_here(record, facts.now))
            plan = plan_admission(facts)
            writes = plan.writes
    for write in writes:
        if not _write(conn, write):
            raise LostRace
    charge = next((w.charge for w in plan.writes if isinstance(w, ConsumeBudget)), None)
    if charge is not None and plan.held and facts.effect_key is not None:
        # Remembered with the attempt: a record resolved failed later gives it back then.
        budgets.record_charge(conn, charge, facts.effect_key, facts.action.action_id, plan.attempt)
    return _record(conn, facts, plan, logged=logged)


def _insert(conn: Connection, write: InsertEffect, facts: Facts, plan: Plan) -> bool:
    """Take the key. On PostgreSQL a plan without a receipt also appends its events in the
    same statement (one round trip), only if the key was free."""
    if conn.dialect.name == "postgresql" and plan.receipt is None and plan.events:
        alone = len(plan.writes) == 1  # nothing more is written when the key was free
        rows = _rows(facts, plan)
        return pg_hot.insert_effect_with_events(conn, write.values, rows, alone=alone)
    return ledger.insert_effect(conn, write.values)


def _rows(facts: Facts, plan: Plan) -> list[dict[str, Any]]:
    return [
        ledger.event_row(facts.now, e.type, e.action_id, e.effect_key, e.approval_id, e.data)
        for e in plan.events
    ]


def _write(conn: Connection, write: Write) -> bool:
    if isinstance(write, MoveEffect):
        return ledger.move_effect(
            conn,
            write.effect_key,
            old=write.old,
            new=write.new,
            action_id=write.action_id,
            attempt=write.attempt,
            values=write.values,
        )
    if isinstance(write, MoveApproval):
        return ledger.move_approval(
            conn, write.approval_id, old=write.old, new=write.new, values=write.values
        )
    if isinstance(write, ConsumeBudget):
        return budgets.consume(conn, write.ask, (write.ask.spent or 0) + write.charge.amount)
    if isinstance(write, InsertApproval):
        ledger.insert_approval(conn, write.values)
        return True
    return ledger.insert_effect(conn, write.values)


def _record(conn: Connection, facts: Facts, plan: Plan, *, logged: bool = False) -> Admitted:
    """Append the plan's events (one statement, unless ``logged``: written with the key) and
    its receipt, if it writes one: the transaction's last write (on PostgreSQL the events go
    with the chain's next number, and the receipt with the COMMIT)."""
    attempt = attempt_of(facts, plan)
    spec = plan.receipt
    if spec is None:
        if not logged:
            ledger.append_events(conn, _rows(facts, plan))
        return Admitted(plan, attempt)
    rows = _rows(facts, plan)
    chain, last, position = None, False, None
    if conn.dialect.name == "postgresql" and rows:
        # The events and the chain's next number in one round trip, the receipt and the head
        # with the COMMIT in another: nothing is written after the plan's receipt.
        seq, prev, pos = pg_hot.events_and_chain(conn, rows)
        chain, last, position = (seq, prev), True, pos
    else:
        position = ledger.append_events(conn, rows, returning=True)
    receipt = attempt_receipt(
        conn,
        attempt,
        spec.result,
        None,
        facts.now,
        error=spec.error,
        approval_id=spec.approval_id,
        event_pos=position,
        chain=chain,
        commit=last,
    )
    return Admitted(plan, attempt, receipt)
