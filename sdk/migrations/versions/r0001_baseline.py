"""Baseline: effects, events, receipts and their chain head, approvals."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
GENESIS = "sha256:" + "00" * 32


def upgrade() -> None:
    op.create_table(
        "effects",
        sa.Column("effect_key", sa.String, primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("action_id", sa.String(40), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("lease_expires_at", sa.String(32)),
        sa.Column("action_name", sa.String),
        sa.Column("action_json", sa.Text),
        sa.Column("idempotency_key", sa.String),
        sa.Column("upstream", sa.String),
        sa.Column("result_json", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("resolved_by", sa.String),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("updated_at", sa.String(32), nullable=False),
        sa.Column("attempt_started_at", sa.String(32)),
        sa.Column("committed_at", sa.String(32)),
    )
    op.create_index("effects_by_state", "effects", ["state", "updated_at"])
    op.create_table(
        "events",
        sa.Column("event_id", BigId, primary_key=True, autoincrement=True),
        sa.Column("ts", sa.String(32), nullable=False),
        sa.Column("type", sa.String(40), nullable=False),
        sa.Column("action_id", sa.String(40)),
        sa.Column("effect_key", sa.String),
        sa.Column("approval_id", sa.String(40)),
        sa.Column("data_json", sa.Text, nullable=False),
    )
    op.create_index("events_by_action", "events", ["action_id"])
    op.create_index("events_by_type", "events", ["type", "event_id"])
    op.create_table(
        "receipts",
        sa.Column("receipt_id", sa.String(40), primary_key=True),
        sa.Column("action_id", sa.String(40), nullable=False),
        sa.Column("effect_key", sa.String),
        sa.Column("result", sa.String(16), nullable=False),
        sa.Column("json", sa.Text, nullable=False),
        sa.Column("ts", sa.String(32), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False, unique=True),
        sa.Column("prev_hash", sa.String(80), nullable=False),
        sa.Column("hash", sa.String(80), nullable=False),
        sa.Column("event_pos", sa.BigInteger),
    )
    op.create_index("receipts_by_action", "receipts", ["action_id"])
    chain = op.create_table(
        "receipt_chain",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("hash", sa.String(80), nullable=False),
        sa.CheckConstraint("id = 1", name="receipt_chain_one_row"),
    )
    op.bulk_insert(chain, [{"id": 1, "seq": 0, "hash": GENESIS}])
    op.create_table(
        "approvals",
        sa.Column("approval_id", sa.String(40), primary_key=True),
        sa.Column("action_hash", sa.String(80), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("action_json", sa.Text, nullable=False),
        sa.Column("approver", sa.String),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("granted_at", sa.String(32)),
        sa.Column("expires_at", sa.String(32), nullable=False),
        sa.Column("consumed_at", sa.String(32)),
        sa.Column("policy_hash", sa.String(80)),
    )
    op.create_index("approvals_by_status", "approvals", ["status"])
