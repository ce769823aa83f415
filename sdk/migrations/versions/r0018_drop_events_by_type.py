"""Drop ``events_by_type``: no query reads events by type, and every event paid for it.

Each protected call appends five events of four or five types, and each type's entries sit in
their own part of that index, so the call dirtied up to five more index pages, which SQLite
writes whole into its log at every commit (about a quarter of a call's WAL). The events a
timeline reads by type have their own partial index (``events_timeline``, revision 0003).
Compatible with older sidecars on the same ledger: none of their queries uses the index.
"""

from __future__ import annotations

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("events_by_type", table_name="events")
