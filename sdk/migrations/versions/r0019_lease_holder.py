"""Who holds a lease, and when it ends on the holder host's monotonic clock.

- ``effects.lease_holder``: the process that wrote the lease (boot id, time and pid
  namespaces, pid, start time), so that another process on that host can tell whether it is
  still running (``holder.py``).
- ``effects.lease_steady_until``: the lease's end on that host's monotonic clock, which a step
  of the wall clock does not move.

Additive: a process still on an older revision writes neither, and its leases are judged on
the ledger's clock alone, as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("effects", sa.Column("lease_holder", sa.String))
    op.add_column("effects", sa.Column("lease_steady_until", sa.Float))
