"""The store boundary: a database driver's error becomes a ``StoreError`` where it enters.

The kernel reaches the database two ways: through SQLAlchemy (which wraps driver errors in
``sqlalchemy.exc.DBAPIError``) and, for the statements every decision runs, straight through
the driver's own cursor (``ledger._run``), whose ``sqlite3.Error`` or ``psycopg.Error`` nobody
wraps. Every transaction, read and open runs inside ``map_driver_errors``, so whichever way an
error comes, callers (``@protect``, the proxy's store-error answer and metric, the CLI) see
one ``StoreError``, chained ``from`` the driver's exception, as httpx's
``map_httpcore_exceptions`` does for its transports.
"""

from __future__ import annotations

import sqlite3
import sys
from types import TracebackType

from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from .errors import CTRLRunError, StoreError


def driver_error_types() -> tuple[type[BaseException], ...]:
    """The exception bases that mean "the database said no", for the drivers loaded now.

    psycopg is looked up in ``sys.modules`` rather than imported: ``import ctrlrun`` must not
    pull it in, and an error of psycopg's can only exist once something imported it.
    """
    types: tuple[type[BaseException], ...] = (SQLAlchemyError, sqlite3.Error, sqlite3.Warning)
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None:
        types += (psycopg.Error, psycopg.Warning)
    return types


def is_driver_error(exc: BaseException) -> bool:
    return not isinstance(exc, CTRLRunError) and isinstance(exc, driver_error_types())


class map_driver_errors:
    """Re-raise a driver (or SQLAlchemy) error leaving the block as ``StoreError``.

    ``where`` starts the message: ``ledger at sqlite:///…: UNIQUE constraint failed: …``.
    A class rather than ``@contextmanager``: it wraps every decision, and costs less.
    """

    __slots__ = ("where",)

    def __init__(self, where: str) -> None:
        self.where = where

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None and is_driver_error(exc):
            raise StoreError(f"{self.where}: {one_line(exc)}") from exc


def one_line(exc: BaseException) -> str:
    """The first line of what the database said (the driver's message, not SQLAlchemy's)."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        exc = exc.orig
    text_ = str(exc).strip().splitlines()
    return text_[0] if text_ else type(exc).__name__
