"""One decision of a batch (``group_commit.GroupCommit.run_here`` and ``submit``), and what
SQLite's busy handling looks like to a batch."""

from __future__ import annotations

import contextvars
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import Connection


class Failed(Protocol):
    error: BaseException | None  # set when the group's COMMIT failed (or it broke)


class Resolve(Protocol):
    def __call__(self, result: Any, error: BaseException | None) -> None: ...


@dataclass
class Job:
    """One decision of a batch; ``done`` gets its result once it is committed."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    done: Resolve
    here: bool = False  # run by ``run_here`` (the caller's thread, which must not wait)
    context: contextvars.Context = field(default_factory=contextvars.copy_context)
    groups: list[Failed] = field(default_factory=list)  # the groups its bodies joined
    result: Any = None
    error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.context.run(self.fn, *self.args)
        except BaseException as exc:  # handed to its caller, like a worker thread's
            self.error = exc

    def resolve(self) -> None:
        lost = next((g.error for g in self.groups if g.error is not None), None)
        if lost is not None:
            self.result, self.error = None, lost
        self.done(self.result, self.error)


def busy_timeout(conn: Connection, ms: int) -> None:
    conn.connection.dbapi_connection.execute(f"PRAGMA busy_timeout={ms}")  # type: ignore[union-attr]


def busy(exc: BaseException) -> bool:
    """SQLite said SQLITE_BUSY (directly from the driver, or wrapped by SQLAlchemy)."""
    orig = getattr(exc, "orig", exc)
    code = getattr(orig, "sqlite_errorcode", None)
    return code is not None and code & 0xFF == sqlite3.SQLITE_BUSY
