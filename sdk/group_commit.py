"""Group commit: the write transactions of one process's concurrent callers share one COMMIT.

SQLite has one writer at a time. Without this, every thread that wants to write opens its own
``BEGIN IMMEDIATE``, and those that find the lock taken sleep in SQLite's busy handler (1 ms,
then 2, 5, 10 …) whatever the holder is doing: under eight concurrent requests most of a
decision's time is that sleep, and every decision pays a COMMIT of its own.

Here the callers of one process queue on a lock instead, and run their bodies one after the
other inside one transaction, each under a savepoint of its own:

- The first caller opens the transaction (``BEGIN IMMEDIATE``); the next ones, queued while it
  ran, join it. The last caller of the group (nobody else queued, or ``MAX_GROUP`` reached)
  commits, with the others' bodies in it.
- Nobody's ``transaction()`` returns before the COMMIT that holds its body: a reservation is
  durable before anything is forwarded, an outcome before it is answered. A body reads the
  writes of the bodies before it in its group; as it returns only once they are committed with
  it, nothing it decides rests on a write that was not kept.
- A body that raises is undone alone (``ROLLBACK TO`` its savepoint; the first one, with
  nothing before it, rolls the transaction back) and its exception is raised at once: it wrote
  nothing. The others go on.
- A COMMIT that fails fails every caller of its group: each gets the ``StoreError``, so a
  reservation in it is refused (nothing forwarded) and an outcome in it stays unrecorded,
  under its lease, as a crash would leave it.

Bodies never wait on the network (reconciles, approvals and deliveries ask outside their
transactions), so holding the write lock across a group costs what the bodies cost.

One connection serves every group, kept from one to the next: checking a connection out of
the pool and back for each transaction cost more Python than the statements of a decision.
A connection whose COMMIT or ROLLBACK failed is thrown away, and the next group opens another.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

from sqlalchemy import Connection, NestedTransaction

from .errors import StoreError

MAX_GROUP = 32  # bodies per COMMIT at most: the first one's answer waits for the last
COMMIT_WAIT = 120.0  # seconds a caller waits for its group's COMMIT before giving up


class _Group:
    """One open transaction and the callers whose bodies are in it."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.size = 0
        self.done = threading.Event()
        self.error: BaseException | None = None


class GroupCommit:
    """``transaction()`` for one engine, shared by every thread of this process."""

    def __init__(self, connect: Callable[[], Connection], begin: Callable[[Connection], None]):
        self._connect, self._begin = connect, begin
        self._lock = threading.Lock()  # held while a body runs, and while a group commits
        self._queued = 0  # callers waiting for the lock (they will join the open group)
        self._count = threading.Lock()
        self._group: _Group | None = None
        self._conn: Connection | None = None  # kept between groups (see the docstring)
        self._inside = threading.local()

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        if getattr(self._inside, "body", False):
            # It would wait for the lock it holds; on its own connection, for the write lock.
            raise StoreError("a ledger transaction was opened inside another one")
        with self._count:
            self._queued += 1
        try:
            self._lock.acquire()
        finally:
            with self._count:
                self._queued -= 1
        try:
            group = self._join()
            savepoint = None if group.size == 1 else self._savepoint(group)
            self._inside.body = True
            try:
                yield group.conn
                if savepoint is not None:
                    savepoint.commit()
            except BaseException:
                self._undo(group, savepoint)
                raise
            finally:
                self._inside.body = False
            if self._queued == 0 or group.size >= MAX_GROUP:
                self._commit(group)
        finally:
            self._lock.release()
        self._wait(group)

    def _join(self) -> _Group:
        group = self._group
        if group is None:
            conn = self._conn or self._connect()
            self._conn = None  # given back by a group that ends cleanly
            try:
                self._begin(conn)
            except BaseException:
                self._discard(conn)
                raise
            group = self._group = _Group(conn)
        group.size += 1
        return group

    def _undo(self, group: _Group, savepoint: NestedTransaction | None) -> None:
        group.size -= 1
        if savepoint is not None:
            try:
                savepoint.rollback()
            except BaseException as exc:
                self._fail(group, exc)
                raise
            if self._queued == 0 and group.size > 0:
                self._commit(group)  # the others' bodies are done: commit them now
            return
        # The first body: nothing else is in the transaction yet.
        self._group = None
        try:
            group.conn.rollback()
        except BaseException:
            self._discard(group.conn)
            raise
        else:
            self._conn = group.conn
        finally:
            group.done.set()

    def _savepoint(self, group: _Group) -> NestedTransaction:
        try:
            return group.conn.begin_nested()
        except BaseException as exc:
            group.size -= 1
            self._fail(group, exc)
            raise

    def _fail(self, group: _Group, exc: BaseException) -> None:
        """The group's connection broke mid-group: nothing of it is kept, every caller fails,
        and the next transaction starts a new group on a new connection."""
        self._group = None
        group.error = exc
        self._discard(group.conn)
        group.done.set()

    def _commit(self, group: _Group) -> None:
        self._group = None
        try:
            group.conn.commit()
        except BaseException as exc:
            group.error = exc
            self._discard(group.conn)
        else:
            self._conn = group.conn
        finally:
            group.done.set()

    def _discard(self, conn: Connection) -> None:
        with suppress(Exception):  # the connection is gone: closing it is all that is left
            conn.rollback()
        with suppress(Exception):
            conn.invalidate()
        with suppress(Exception):
            conn.close()

    def close(self) -> None:
        """Close the connection kept between groups (the store is closing)."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(Exception):
                conn.close()

    def _wait(self, group: _Group) -> None:
        if not group.done.wait(COMMIT_WAIT):
            raise StoreError(f"the ledger's COMMIT did not finish within {COMMIT_WAIT:.0f} s")
        if group.error is not None:
            raise group.error
