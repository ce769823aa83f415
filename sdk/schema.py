"""The ledger's tables, shared by SQLite and PostgreSQL. Alembic migrations create them."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    text,
)

from .events import TIMELINE_EVENTS

metadata = MetaData()

# An autoincrementing 64-bit key on PostgreSQL that is still SQLite's ROWID alias.
BigId = BigInteger().with_variant(Integer(), "sqlite")

effects = Table(
    "effects",
    metadata,
    Column("effect_key", String, primary_key=True),
    Column("state", String(16), nullable=False),
    Column("action_id", String(40), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("lease_expires_at", String(32)),
    Column("action_name", String),
    Column("action_json", Text),  # the canonical action: name, arguments, principal, resource
    Column("idempotency_key", String),  # what the attempt was forwarded with (proxy)
    Column("upstream", String),
    Column("result_json", Text),
    Column("error", Text),
    Column("resolved_by", String),
    Column("created_at", String(32), nullable=False),
    Column("updated_at", String(32), nullable=False),
    Column("attempt_started_at", String(32)),
    Column("committed_at", String(32)),
    # Revision 0004: the schedule of asks about an AMBIGUOUS attempt (reconcile.py, checks.py).
    # They describe attempt ``check_attempt`` only; NULL everywhere: never asked by this code.
    Column("next_check_at", String(32)),  # when the sweep asks next; NULL: as soon as it can
    Column("checks", Integer),  # how many times the remote was asked about that attempt
    Column("check_answer", String(40)),  # the last answer recorded, e.g. "unknown:raised"
    Column("check_attempt", Integer),
    # Revision 0019: who holds the lease and its end on that host's monotonic clock (holder.py).
    Column("lease_holder", String),
    Column("lease_steady_until", Float),
    # Revision 0020: when it was committed on that host's monotonic clock (states.window_over).
    Column("committed_steady", Float),
    Column("committed_on", String),  # that clock: boot id, time namespace (holder.clock)
)
Index("effects_by_state", effects.c.state, effects.c.updated_at)
# The ambiguous effects a sweep asks about, soonest due first. As with TIMELINE, queries must
# use this very condition (a literal, not a parameter) for the planner to use the index.
AMBIGUOUS = text("state = 'ambiguous'")
Index(
    "effects_checks_due",
    effects.c.next_check_at,
    effects.c.updated_at,
    postgresql_where=AMBIGUOUS,
    sqlite_where=AMBIGUOUS,
)

events = Table(
    "events",
    metadata,
    Column("event_id", BigId, primary_key=True, autoincrement=True),
    Column("ts", String(32), nullable=False),
    Column("type", String(40), nullable=False),
    Column("action_id", String(40)),
    Column("effect_key", String),
    Column("approval_id", String(40)),
    Column("data_json", Text, nullable=False),
)
Index("events_by_action", events.c.action_id)
# The events shown between receipts. Queries must use this very condition for the planner to
# see that the partial index (migration 0003) covers them.
TIMELINE = text("type IN (" + ", ".join(f"'{t.value}'" for t in TIMELINE_EVENTS) + ")")
Index("events_timeline", events.c.event_id, postgresql_where=TIMELINE, sqlite_where=TIMELINE)

receipts = Table(
    "receipts",
    metadata,
    Column("receipt_id", String(40), primary_key=True),
    Column("action_id", String(40), nullable=False),
    Column("effect_key", String),
    Column("result", String(16), nullable=False),
    Column("json", Text, nullable=False),
    Column("ts", String(32), nullable=False),
    Column("seq", BigInteger, nullable=False, unique=True),
    Column("prev_hash", String(80), nullable=False),
    Column("hash", String(80), nullable=False),
    Column("event_pos", BigInteger),  # the last event written before it: timeline order
    Column("action", String),  # revision 0002
)
Index("receipts_by_action", receipts.c.action_id)
Index("receipts_by_result", receipts.c.result, receipts.c.action)

receipt_chain = Table(
    "receipt_chain",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("hash", String(80), nullable=False),
)

# Revision 0016: the ledger's identity, written once when it is created (identity.py).
ledger_identity = Table(
    "ledger_identity",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("ledger_id", String(36), nullable=False),
    Column("created_at", String(32), nullable=False),
)

approvals = Table(
    "approvals",
    metadata,
    Column("approval_id", String(40), primary_key=True),
    Column("action_hash", String(80), nullable=False),
    Column("status", String(16), nullable=False),
    Column("action_json", Text, nullable=False),
    Column("approver", String),
    Column("created_at", String(32), nullable=False),
    Column("granted_at", String(32)),
    Column("expires_at", String(32), nullable=False),
    Column("consumed_at", String(32)),
    Column("policy_hash", String(80)),
    Column("approvals_required", Integer),  # revision 0017; NULL: one
)
Index("approvals_by_status", approvals.c.status)

# Revision 0017: each operator's answer to an approval request (approvals.py), never rewritten.
approval_votes = Table(
    "approval_votes",
    metadata,
    Column("approval_id", String(40), primary_key=True),
    Column("operator", String, primary_key=True),
    Column("decision", String(8), primary_key=True),  # "grant" or "deny"
    Column("at", String(32), nullable=False),
)

# Webhook deliveries (revision 0014): how far each webhook has read the events (notify.py).
notify_cursors = Table(
    "notify_cursors",
    metadata,
    Column("target", String(80), primary_key=True),
    Column("last_event_id", BigInteger, nullable=False),
    Column("holder", String(80)),
    Column("lease_until", String(32)),
    Column("failures", Integer, nullable=False, server_default="0"),
    Column("next_at", String(32)),
    Column("last_error", Text),
)

# The kill switch (revision 0013): one row per frozen scope, "*" for every action.
freezes = Table(
    "freezes",
    metadata,
    Column("scope", String(200), primary_key=True),
    Column("reason", Text, nullable=False),
    Column("frozen_by", String, nullable=False),
    Column("frozen_at", String(32), nullable=False),
)

# Budgets (revision 0015): what each scope has spent of an action's budget in one window.
budgets = Table(
    "budgets",
    metadata,
    Column("action", String, primary_key=True),
    Column("scope", String, primary_key=True),  # "agent:NAME", "user:NAME" or "*"
    Column("window_start", String(32), primary_key=True),
    Column("spent", BigInteger, nullable=False),
)

# Revision 0017: what each attempt holding an effect key spent, given back if it ends failed.
budget_charges = Table(
    "budget_charges",
    metadata,
    Column("effect_key", String, primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("action_id", String(40), primary_key=True),
    Column("action", String, nullable=False),
    Column("scope", String, nullable=False),
    Column("window_start", String(32), nullable=False),
    Column("amount", BigInteger, nullable=False),
    Column("returned_at", String(32)),  # NULL: still spent
)

GENESIS_HASH = "sha256:" + "00" * 32
