"""A ledger knows itself: one row holding the identity (a UUID) written when it was created.

A process remembers the identity of the ledger it opened and refuses to write into any other
(a file deleted and recreated, a database dropped and migrated afresh). A ledger created
before this revision gets its identity when it is upgraded. Additive: older sidecars never
read the table.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "ledger_identity",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("ledger_id", sa.String(36), nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.CheckConstraint("id = 1", name="ledger_identity_one_row"),
    )
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    op.bulk_insert(table, [{"id": 1, "ledger_id": str(uuid.uuid4()), "created_at": now}])
