"""The SQLite ledger's checkpoints, in a thread of their own (see ``Checkpointer``)."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


class Checkpointer:
    """Copies the WAL into the database twenty times a second, off every request's path.

    By default a writer whose commit finds the WAL past 1000 pages checkpoints it inline, with
    an fsync: at a few hundred decisions a second that is a stall every few dozen requests.
    Here writers never checkpoint; this thread does. Under steady writes a passive checkpoint
    never sees the WAL complete (frames arrive while it copies), so the next writer never
    starts the log over and the WAL grows: every commit then extends the file, and extending
    a file waits behind the checkpoint's fsync (tens of milliseconds). So a round whose
    passive checkpoint leaves more than ``RESTART_FRAMES`` in the log restarts it: the few
    frames left are copied with writers held back for that moment, and writers then reuse the
    WAL's first pages in place. A process that never writes (the CLI reading) keeps SQLite's
    default.

    ``problem`` (the store's ``FileWatch.problem``) is asked before every checkpoint: a file
    that is no longer the ledger this process opened (truncated, replaced, its WAL removed)
    is never checkpointed into. A checkpoint into a truncated file would write the logged
    pages back at their offsets, and the file would no longer look truncated.
    """

    INTERVAL = 0.05
    RESTART_FRAMES = 1024  # 4 MiB of 4 KiB pages
    # How long a restart may wait for readers still on the log (it holds writers meanwhile).
    RESTART_WAIT = 0.1

    def __init__(self, path: Path, problem: Callable[[], str | None] | None = None) -> None:
        self.path = path
        self._problem = problem or (lambda: None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ctrlrun-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conn = sqlite3.connect(self.path, timeout=self.RESTART_WAIT, isolation_level=None)
        try:
            while not self._stop.wait(self.INTERVAL):
                if self._lost():
                    return
                try:
                    self.round(conn)
                except sqlite3.Error as exc:  # a busy database: the next round catches up
                    log.debug("checkpoint of %s deferred: %s", self.path, exc)
            if not self._lost():
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error:
            pass
        finally:
            conn.close()

    def _lost(self) -> bool:
        try:
            what = self._problem()
        except OSError as exc:  # the file cannot even be looked at: not checkpointed into
            what = f"could not be looked at ({exc})"
        if what is not None:
            log.warning("the ledger at %s %s: no more checkpoints into it", self.path, what)
        return what is not None

    @classmethod
    def round(cls, conn: sqlite3.Connection) -> bool:
        """One checkpoint; True when it started the log over."""
        busy, logged, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if busy or logged <= cls.RESTART_FRAMES:
            return False
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
        return not busy

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
