"""Ambiguous effects carry the schedule of asks about them: when next, how many, last answer.

Additive: four nullable columns and a partial index. A sidecar still on revision 0003 keeps
working against this schema: it never names the columns (its inserts leave them NULL, which
means "never asked"), and the index covers only ambiguous records.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

AMBIGUOUS = "state = 'ambiguous'"


def upgrade() -> None:
    # One ALTER per column: SQLite adds a column with ALTER TABLE (no table rebuild), and
    # PostgreSQL adds a nullable column without a default without rewriting the table.
    op.add_column("effects", sa.Column("next_check_at", sa.String(32), nullable=True))
    op.add_column("effects", sa.Column("checks", sa.Integer, nullable=True))
    op.add_column("effects", sa.Column("check_answer", sa.String(40), nullable=True))
    op.add_column("effects", sa.Column("check_attempt", sa.Integer, nullable=True))
    op.create_index(
        "effects_checks_due",
        "effects",
        ["next_check_at", "updated_at"],
        postgresql_where=sa.text(AMBIGUOUS),
        sqlite_where=sa.text(AMBIGUOUS),
    )
