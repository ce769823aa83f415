"""Receipts carry their action name in a column, so counts need not parse every document.

Additive: a sidecar still on revision 0001 keeps working against this schema (it leaves the
column NULL, and readers fall back to the document).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("receipts", sa.Column("action", sa.String, nullable=True))
    op.create_index("receipts_by_result", "receipts", ["result", "action"])
