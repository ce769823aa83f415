"""Budgets: one row per (action, scope, window start) with what it has spent.

Additive: a process still on an older revision never reads it, so it does not enforce a
budget; every sidecar and SDK process on the ledger must run this revision before a budget
is relied on.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "budgets",
        sa.Column("action", sa.String, primary_key=True),
        sa.Column("scope", sa.String, primary_key=True),
        sa.Column("window_start", sa.String(32), primary_key=True),
        sa.Column("spent", sa.BigInteger, nullable=False),
    )
