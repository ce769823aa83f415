"""Webhook deliveries: one cursor per webhook over the events table, which is the outbox.

Every event a notification reports (an approval requested, granted, denied or expired; an
effect ambiguous or resolved; a freeze) is already an event row, written in the transaction
that made it. A webhook's cursor says how far its deliveries have got, and which sidecar holds
the right to send them (a lease), so whichever sidecar runs sends each event once, in order,
after any restart. Additive: older processes never read it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notify_cursors",
        sa.Column("target", sa.String(80), primary_key=True),
        sa.Column("last_event_id", sa.BigInteger, nullable=False),
        sa.Column("holder", sa.String(80)),
        sa.Column("lease_until", sa.String(32)),
        sa.Column("failures", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_at", sa.String(32)),
        sa.Column("last_error", sa.Text),
    )
