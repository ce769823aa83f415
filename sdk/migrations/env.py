"""Alembic environment: ctrlrun always hands it an open connection inside a locked transaction."""

from __future__ import annotations

from alembic import context

from ctrlrun.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, transactional_ddl=True)
with context.begin_transaction():
    context.run_migrations()
