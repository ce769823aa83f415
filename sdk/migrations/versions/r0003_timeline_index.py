"""An index of the events ``ctrlrun receipts`` shows between receipts.

Without it, finding the last reconciliations walks every event back to the most recent one;
on a ledger whose last reconciliation is old, that is millions of rows. Additive.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TIMELINE = "type IN ('RECONCILIATION_STARTED', 'RECONCILIATION_RESOLVED', 'EFFECT_RESOLVED')"


def upgrade() -> None:
    op.create_index(
        "events_timeline",
        "events",
        ["event_id"],
        postgresql_where=sa.text(TIMELINE),
        sqlite_where=sa.text(TIMELINE),
    )
