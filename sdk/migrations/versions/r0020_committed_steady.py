"""When an effect was committed on the committing host's monotonic clock.

- ``effects.committed_steady``: ``time.monotonic()`` of the process that recorded the commit
  (or resolved the record committed), when it did.
- ``effects.committed_on``: which monotonic clock that reading is on (boot id and time
  namespace): readings on one clock compare, whichever process took them.

A policy ``window:`` then holds for its length of elapsed time, which no step of the wall
clock shortens (``states.window_over``). Additive: a process on an older revision writes
neither, and its commits are judged on the ledger's clock and this host's time since boot.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("effects", sa.Column("committed_steady", sa.Float))
    op.add_column("effects", sa.Column("committed_on", sa.String))
