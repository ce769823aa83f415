"""Quorum approvals and budget charges that outlive their attempt.

- ``approvals.approvals_required``: how many different operators must approve a request,
  written when it is created (the policy of the process that asked); NULL means one (a request
  made by a process on an older revision).
- ``approval_votes``: one row per operator's answer to a request (``grant`` or ``deny``),
  never rewritten; a request is granted once its distinct ``grant`` votes reach the number.
- ``budget_charges``: what each attempt holding an effect key spent of a budget, so the
  amount is given back when the attempt ends ``failed``, also later, when an AMBIGUOUS record
  is resolved ``failed`` by a reconciler or a human (``returned_at`` says it was given back).

Additive: a process still on an older revision never reads these, so it counts one approval
as enough and does not give back an ambiguous attempt's amount once resolved.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("approvals", sa.Column("approvals_required", sa.Integer))
    op.create_table(
        "approval_votes",
        sa.Column("approval_id", sa.String(40), primary_key=True),
        sa.Column("operator", sa.String, primary_key=True),
        sa.Column("decision", sa.String(8), primary_key=True),
        sa.Column("at", sa.String(32), nullable=False),
    )
    op.create_table(
        "budget_charges",
        sa.Column("effect_key", sa.String, primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("action_id", sa.String(40), primary_key=True),
        sa.Column("action", sa.String, nullable=False),
        sa.Column("scope", sa.String, nullable=False),
        sa.Column("window_start", sa.String(32), nullable=False),
        sa.Column("amount", sa.BigInteger, nullable=False),
        sa.Column("returned_at", sa.String(32)),
    )
