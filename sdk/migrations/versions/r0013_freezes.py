"""The kill switch: a table of frozen scopes (an action name, or "*" for every action).

Additive: a process still on an older revision never reads it, so it does not honour a
freeze; every sidecar and SDK process on the ledger must run this revision before the switch
is relied on.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "freezes",
        sa.Column("scope", sa.String(200), primary_key=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("frozen_by", sa.String, nullable=False),
        sa.Column("frozen_at", sa.String(32), nullable=False),
    )
