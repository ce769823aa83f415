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

Batches: the proxy's decisions need not each wake a worker thread of their own
(``decisions.decide``). The ones an event loop queued during one of its iterations run as one
batch: one after the other, holding the lock, in one group, a savepoint each, then one COMMIT,
and only then is any result handed back. ``run_here`` runs the batch on the loop's own thread
when nothing can make it wait: the lock free, a connection kept from before, and the
database's write lock taken at once (``BEGIN IMMEDIATE`` with a busy timeout of 0; SQLite
answers SQLITE_BUSY while another process writes or a checkpoint runs). Otherwise the batch
goes to the decision thread (``submit``), which may wait. A job whose transaction was in a
group whose COMMIT failed gets that error instead of its result. Jobs never wait on the
network: a reconcile is asked outside any batch (``Control.reconcile_first``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from sqlalchemy import Connection

from .batch_job import Job, busy, busy_timeout
from .driver_errors import is_driver_error, one_line
from .errors import StoreError
from .sqlite_session import BUSY_TIMEOUT_MS

MAX_GROUP = 32  # bodies per COMMIT at most: the first one's answer waits for the last
COMMIT_WAIT = 120.0  # seconds a caller waits for its group's COMMIT before giving up


class _Group:
    """One open transaction and the callers whose bodies are in it."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        # Savepoints go to the driver as text: SQLAlchemy's nested transactions cost more
        # Python than a decision's statements, and bodies never nest (one name serves all).
        self.raw: Any = conn.connection.dbapi_connection
        self.size = 0
        self.done = threading.Event()
        self.error: BaseException | None = None


class GroupCommit:
    """``transaction()`` for one engine, shared by every thread of this process."""

    def __init__(
        self,
        connect: Callable[[], Connection],
        begin: Callable[[Connection], None],
        *,
        where: str = "ledger",
    ):
        self._connect, self._begin = connect, begin
        self.where = where  # starts the message of a group's failure (as map_driver_errors)
        # Whether nothing but the lock could make a batch wait (the store's own checks):
        # otherwise ``run_here`` leaves the batch to the decision thread.
        self.here_ok: Callable[[], bool] = lambda: True
        self._lock = threading.Lock()  # held while a body runs, and while a group commits
        self._queued = 0  # callers waiting for the lock (they will join the open group)
        self._count = threading.Lock()
        self._group: _Group | None = None
        self._conn: Connection | None = None  # kept between groups (see the docstring)
        self._inside = threading.local()
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._starting = threading.Lock()
        self._hasty: Connection | None = None  # the kept connection, if its busy timeout is 0

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        if getattr(self._inside, "body", False):
            # It would wait for the lock it holds; on its own connection, for the write lock.
            raise StoreError("a ledger transaction was opened inside another one")
        job: Job | None = getattr(self._inside, "job", None)
        if job is None:
            self._take_lock()
        elif self._group is None and job.here:
            # The batch's transaction ended early (its connection broke): a new BEGIN here
            # might wait for the lock, on the loop. Refused, as a failed COMMIT would be.
            raise StoreError(f"{self.where}: the batch's transaction was lost")
        try:
            group = self._join()
            if job is not None:
                job.groups.append(group)  # its result waits for this group's COMMIT
            savepoint = group.size > 1 and self._savepoint(group)
            self._inside.body = True
            try:
                yield group.conn
                if savepoint:
                    group.raw.execute("RELEASE body")
            except BaseException:
                self._undo(group, savepoint)
                raise
            finally:
                self._inside.body = False
            if job is None and (self._queued == 0 or group.size >= MAX_GROUP):
                self._commit(group)
        finally:
            if job is None:
                self._lock.release()
        if job is None:
            self._wait(group)

    def _take_lock(self) -> None:
        with self._count:
            self._queued += 1
        try:
            self._lock.acquire()
        finally:
            with self._count:
                self._queued -= 1

    def _join(self) -> _Group:
        group = self._group
        if group is None:
            conn = self._conn or self._connect()
            self._conn = None  # given back by a group that ends cleanly
            try:
                if conn is self._hasty:  # back to waiting for the lock (see ``run_here``)
                    busy_timeout(conn, BUSY_TIMEOUT_MS)
                    self._hasty = None
                self._begin(conn)
            except BaseException:
                self._discard(conn)
                raise
            group = self._group = _Group(conn)
        group.size += 1
        return group

    def _undo(self, group: _Group, savepoint: bool) -> None:
        group.size -= 1
        if savepoint:
            try:
                group.raw.execute("ROLLBACK TO body")
                group.raw.execute("RELEASE body")
            except BaseException as exc:
                self._fail(group, exc)
                raise
            batch = getattr(self._inside, "job", None) is not None  # it commits at its end
            if not batch and self._queued == 0 and group.size > 0:
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

    def _savepoint(self, group: _Group) -> bool:
        try:
            group.raw.execute("SAVEPOINT body")
            return True
        except BaseException as exc:
            group.size -= 1
            self._fail(group, exc)
            raise

    def _fail(self, group: _Group, exc: BaseException) -> None:
        """The group's connection broke mid-group: nothing of it is kept, every caller fails,
        and the next transaction starts a new group on a new connection."""
        self._group = None
        group.error = self._failure(exc)
        self._discard(group.conn)
        group.done.set()

    def _commit(self, group: _Group) -> None:
        self._group = None
        try:
            group.conn.commit()
        except BaseException as exc:
            group.error = self._failure(exc)
            self._discard(group.conn)
        else:
            self._conn = group.conn
        finally:
            group.done.set()

    def _failure(self, exc: BaseException) -> BaseException:
        """What every caller of a failed group is told: a driver's error as ``StoreError``."""
        if is_driver_error(exc):
            failed = StoreError(f"{self.where}: {one_line(exc)}")
            failed.__cause__ = exc
            return failed
        return exc

    def _discard(self, conn: Connection) -> None:
        if conn is self._hasty:
            self._hasty = None
        with suppress(Exception):  # the connection is gone: closing it is all that is left
            conn.rollback()
        with suppress(Exception):
            conn.invalidate()
        with suppress(Exception):
            conn.close()

    # -- batches ------------------------------------------------------------------------------

    def run_here(self, batch: list[Job]) -> bool:
        """Run ``batch`` in one transaction on this thread, if that needs no waiting: the lock
        free, the database's write lock taken at once (busy timeout 0), a connection kept from
        before. False: nothing ran; ``submit`` them. An event loop decides this way without a
        thread hop; checkpoints, other processes' writers and other threads make it wait on
        the decision thread instead, never on the loop."""
        if self._conn is None or not self.here_ok() or not self._lock.acquire(blocking=False):
            return False
        try:
            if self._group is None and not self._open_hasty():
                return False
            group = self._group
            assert group is not None
            group.size += 1  # held open to the end: every body takes a savepoint
            for job in batch:
                job.here = True
                self._run(job)
            group.size -= 1
            if self._group is not None:
                self._commit(self._group)
        finally:
            self._lock.release()
        for job in batch:
            with suppress(Exception):  # one caller's failure to be told leaves the others told
                job.resolve()
        return True

    def _open_hasty(self) -> bool:
        """Open a group on the kept connection with a busy timeout of 0: False if SQLite
        answers SQLITE_BUSY (the write lock is held elsewhere, or a checkpoint runs)."""
        conn, self._conn = self._conn, None
        assert conn is not None
        try:
            if self._hasty is not conn:
                busy_timeout(conn, 0)
                self._hasty = conn
            self._begin(conn)
        except BaseException as exc:
            if not busy(exc):
                self._discard(conn)
                raise
            self._conn = conn
            return False
        self._group = _Group(conn)
        return True

    def _run(self, job: Job) -> None:
        self._inside.job = job
        try:
            job.run()
        finally:
            self._inside.job = None

    # -- the decision thread ----------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue ``job`` for the decision thread (started at the first one)."""
        with self._starting:
            if self._closed:
                raise StoreError("the ledger is closed")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="ctrlrun-ledger-decisions", daemon=True
                )
                self._thread.start()
            self._jobs.put(job)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self._take_lock()  # the jobs queued meanwhile join this batch
            try:
                self._run_batch(self._drain(job))
            finally:
                self._lock.release()

    def _drain(self, first: Job) -> list[Job]:
        batch = [first]
        while len(batch) < MAX_GROUP:
            try:
                nxt = self._jobs.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                self._jobs.put(None)  # stop after this batch
                break
            batch.append(nxt)
        return batch

    def _run_batch(self, batch: list[Job]) -> None:
        """Run ``batch`` (the lock held), commit it, then tell each job's caller."""
        try:
            for job in batch:
                self._run(job)
            if self._group is not None:
                self._commit(self._group)
        except BaseException as exc:  # pragma: no cover (a bug here fails the batch, closed)
            for job in batch:
                if job.error is None:
                    job.result, job.error = None, exc
        for job in batch:
            with suppress(Exception):  # a caller gone (its loop closed) has nobody to tell
                job.resolve()

    def close(self) -> None:
        """Finish the queued decisions, then close the connection kept between groups."""
        with self._starting:
            self._closed, thread = True, self._thread
        if thread is not None:
            self._jobs.put(None)
            thread.join(COMMIT_WAIT)
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
