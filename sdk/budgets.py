"""Budgets: how much of an action may be done per window, spent in the reservation's transaction.

An action's ``budget: {sum: amount, max: 500000, per: 1d, by: agent}`` (or ``count: true``
instead of ``sum:``) caps the sum of an integer argument, or the number of attempts, per
agent, per user or for everyone, over a calendar window: windows of ``per`` aligned to the
Unix epoch (``1d`` runs from 00:00 UTC to 00:00 UTC). A fixed window keyed by its start is
one row per (action, scope, window start) holding ``spent``; admission reads it with a row
lock (PostgreSQL's ``FOR UPDATE``; SQLite's transactions are serial) and spends it with a
compare-and-set in the very transaction that reserves the effect key, so N processes on one
ledger cannot spend N times the limit, and a lost race plans again.

An attempt that ends ``failed`` gives its amount back in the transaction that records the
failure; an ``ambiguous`` one keeps it (it may have happened) until it is resolved: resolved
``failed`` (by a reconciler or a human), it gives it back then (``budget_charges`` remembers
what each attempt holding a key spent, revision 0017); resolved ``committed``, it keeps it.
Past the limit the answer is ``budget_exceeded``, or, with ``over: approve``, an approval
request for that very action: once granted it runs and spends beyond the limit. An
argument that is missing, negative or not an integer cannot be measured, so it is refused
(a Stripe refund without ``amount`` refunds whatever remains).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Connection, and_, insert, select, text, update

from .action import Principal, iso
from .schema import budget_charges, budgets
from .yamlstrict import Where, check_keys, expect_choice, expect_map, show

BY = ("agent", "user", "everyone")
BUDGET_KEYS = ("sum", "count", "max", "per", "by", "over")
OVER = ("refuse", "approve")  # past the limit: budget_exceeded, or ask a human (approvals.py)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_INSERT = text(
    "INSERT INTO budgets (action, scope, window_start, spent) VALUES (:a, :s, :w, :n) "
    "ON CONFLICT DO NOTHING"
)


@dataclass(frozen=True)
class Budget:
    """One action's ``budget:``; ``sum`` is the argument summed, None when it counts."""

    max: int
    per: timedelta
    by: Literal["agent", "user", "everyone"]
    sum: str | None = None
    over: Literal["refuse", "approve"] = "refuse"

    def charge(self, arguments: Mapping[str, Any]) -> int | None:
        """What one attempt spends; None when its argument cannot be measured."""
        if self.sum is None:
            return 1
        value = arguments.get(self.sum)
        if isinstance(value, str) and value.isascii() and value.isdigit():
            return int(value)  # form-encoded bodies give numbers as text
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        return None

    def scope(self, principal: Principal) -> str:
        if self.by == "everyone":
            return "*"
        if self.by == "agent":
            return f"agent:{principal.agent}"
        return f"user:{principal.user or ''}"  # requests with no user share one budget

    def window_start(self, now: datetime) -> datetime:
        step = int(self.per.total_seconds())
        seconds = int((now - _EPOCH).total_seconds())
        return _EPOCH + timedelta(seconds=seconds - seconds % step)

    def describe(self) -> str:
        what = f"sum of {self.sum}" if self.sum else "count"
        return f"{what} <= {self.max} per {_duration(self.per)} by {self.by}"


@dataclass(frozen=True)
class BudgetCharge:
    """What an attempt spent of one budget row (given back if it fails)."""

    action: str
    scope: str
    window_start: str
    amount: int


@dataclass(frozen=True)
class BudgetAsk:
    """``Facts.budget``: the row an attempt would spend, and what it has spent so far."""

    action: str
    scope: str
    window_start: str
    max: int
    charge: int | None  # None: the attempt cannot be measured (refused)
    spent: int | None = None  # read in the transaction; None: no row yet
    rule: str = ""
    over: Literal["refuse", "approve"] = "refuse"

    def left(self) -> int:
        return max(self.max - (self.spent or 0), 0)


def ask(
    budget: Budget, action: str, principal: Principal, arguments: Mapping[str, Any], now: datetime
) -> BudgetAsk:
    return BudgetAsk(
        action,
        budget.scope(principal),
        iso(budget.window_start(now)),
        budget.max,
        budget.charge(arguments),
        rule=budget.describe(),
        over=budget.over,
    )


def parse_budget(value: Any, where: Where, duration: Callable[[Any, Where], timedelta]) -> Budget:
    entry = expect_map(value, where)
    check_keys(entry, where, BUDGET_KEYS, required=("max", "per"))
    if ("sum" in entry) == ("count" in entry):
        raise where.error("needs exactly one of sum: ARGUMENT or count: true")
    total: str | None = None
    if "sum" in entry:
        total = entry["sum"]
        if not isinstance(total, str) or not total:
            raise where.key(entry, "sum").error(f"must name an argument, got {show(total)}")
    elif entry["count"] is not True:
        raise where.key(entry, "count").error(f"must be true, got {show(entry['count'])}")
    limit = entry["max"]
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise where.key(entry, "max").error(f"must be a whole number >= 0, got {show(limit)}")
    per = duration(entry["per"], where.key(entry, "per"))
    by = expect_choice(entry.get("by", "agent"), where.key(entry, "by"), BY)
    over = expect_choice(entry.get("over", "refuse"), where.key(entry, "over"), OVER)
    return Budget(limit, per, by, total, over)  # type: ignore[arg-type]


def read_for_update(conn: Connection, a: BudgetAsk) -> int | None:
    """What the row has spent (None: no row), locked until the transaction ends."""
    query = select(budgets.c.spent).where(_row(a.action, a.scope, a.window_start))
    value = conn.execute(query.with_for_update()).scalar()
    return None if value is None else int(value)


def consume(conn: Connection, a: BudgetAsk, new: int) -> bool:
    """Compare-and-set ``spent`` from what was read to ``new``; False: someone moved it."""
    if a.spent is None:  # a racer's insert of the same row wins; ours changes nothing
        values = {"a": a.action, "s": a.scope, "w": a.window_start, "n": new}
        return int(conn.execute(_INSERT, values).rowcount) == 1
    where = and_(_row(a.action, a.scope, a.window_start), budgets.c.spent == a.spent)
    return int(conn.execute(update(budgets).where(where).values(spent=new)).rowcount) == 1


def refund(conn: Connection, charge: BudgetCharge) -> None:
    """Give a failed attempt's amount back (it was spent in this row, so the row exists)."""
    row = _row(charge.action, charge.scope, charge.window_start)
    conn.execute(update(budgets).where(row).values(spent=budgets.c.spent - charge.amount))


def record_charge(
    conn: Connection, charge: BudgetCharge, effect_key: str, action_id: str, attempt: int
) -> None:
    """Remember what the attempt holding ``effect_key`` spent, to give it back if it fails."""
    conn.execute(
        insert(budget_charges).values(
            effect_key=effect_key,
            attempt=attempt,
            action_id=action_id,
            action=charge.action,
            scope=charge.scope,
            window_start=charge.window_start,
            amount=charge.amount,
        )
    )


def give_back(
    conn: Connection, effect_key: str, action_id: str, attempt: int, now: datetime
) -> BudgetCharge | None:
    """The attempt ended ``failed`` (at once, or resolved so later): return what it spent.

    Once per attempt: the charge is marked returned by a compare-and-set, so two settlers of
    the same record cannot give it back twice. None: it spent nothing (or gave it back).
    """
    key = and_(
        budget_charges.c.effect_key == effect_key,
        budget_charges.c.attempt == attempt,
        budget_charges.c.action_id == action_id,
    )
    row = conn.execute(select(budget_charges).where(key)).first()
    if row is None or row.returned_at is not None:
        return None
    mark = update(budget_charges).where(key, budget_charges.c.returned_at.is_(None))
    if conn.execute(mark.values(returned_at=iso(now))).rowcount != 1:
        return None
    charge = BudgetCharge(row.action, row.scope, row.window_start, int(row.amount))
    refund(conn, charge)
    return charge


def spent_rows(conn: Connection, action: str, window_start: str) -> dict[str, int]:
    """Each scope's spending of ``action`` in the window starting ``window_start``."""
    query = select(budgets.c.scope, budgets.c.spent).where(
        and_(budgets.c.action == action, budgets.c.window_start == window_start)
    )
    return {scope: int(spent) for scope, spent in conn.execute(query.order_by(budgets.c.scope))}


def _row(action: str, scope: str, window_start: str) -> Any:
    return and_(
        budgets.c.action == action,
        budgets.c.scope == scope,
        budgets.c.window_start == window_start,
    )


def _duration(per: timedelta) -> str:
    seconds = int(per.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
