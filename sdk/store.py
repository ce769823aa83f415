"""Opening a ledger: engines, durability settings, migrations under a lock, transactions.

``SQLiteStateStore`` (the default, one host) and ``PostgresStateStore`` (many sidecars on many
hosts) differ only in how they connect and lock; every decision is made by the same code in
``ledger.py`` on whichever connection the store hands out.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import NoSuchModuleError

from . import identity as ident
from .checkpoint import Checkpointer
from .clocks import Clock, LedgerClock, Skew, utc_now
from .config import clock_skew_bound, parse_store_url, shown_url, sqlite_file, store_url
from .driver_errors import is_driver_error, map_driver_errors, one_line
from .errors import ConnectionLost, InvalidArgument, MissingDependency, SchemaMismatch, StoreError
from .freeze import FreezeCache
from .group_commit import GroupCommit
from .identity import LedgerLost
from .pg_pool import check_on_checkout
from .pg_session import OPEN_TIMEOUT, options_string, session_options
from .sqlite_session import begin_immediate, sqlite_connect

log = logging.getLogger(__name__)
T = TypeVar("T")

HEAD_REVISION = "0020"
# There are no revisions 0005 to 0012.
KNOWN_REVISIONS = ("0001", "0002", "0003", "0004", *(f"{n:04d}" for n in range(13, 21)))
_MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_PG_LOCK_KEY = 0x63_74_72_6C_72_75_6E  # "ctrlrun": the advisory lock migrations run under


def _broken(conn: Connection) -> bool:
    if conn.invalidated:
        return True
    raw: Any = conn.connection.dbapi_connection
    return bool(getattr(raw, "broken", False) or getattr(raw, "closed", False))


class NoLedger(StoreError):
    """There is no ctrlrun ledger where one was looked for (and none was to be created)."""


class StateStore:
    """A ledger on one SQLAlchemy engine. Use ``transaction()`` for every decision."""

    def __init__(self, engine: Engine, *, create: bool = True) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self.location = shown_url(engine.url)
        # The ledger's clock, that every decision about its records is judged on: on one host
        # the local clock (``PostgresStateStore`` replaces it with the database's).
        self.clock: Clock = utc_now
        self.freezes = FreezeCache()  # this process's view of the kill switch (freeze.py)
        self._closed = False
        self._lost: LedgerLost | None = None  # once set, every transaction is refused
        try:
            self.ledger_id = self._open(create)
        except Exception:
            engine.dispose()
            raise

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location!r})"

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One write transaction; on SQLite it holds the database write lock from the start.

        A connection found dead before COMMIT was sent raises ``ConnectionLost``: the server
        discards what a session wrote without committing it, so nothing was written.
        """
        self._guard()
        with map_driver_errors(f"ledger at {self.location}"), self.engine.connect() as conn:
            self._begin(conn)
            try:
                yield conn
            except BaseException as exc:
                if not _broken(conn):
                    conn.rollback()
                    raise
                conn.invalidate()
                if not is_driver_error(exc):  # OutcomeUnknown: lost with its COMMIT sent
                    raise
                raise ConnectionLost(
                    f"ledger at {self.location}: the connection was lost before COMMIT "
                    f"(nothing was written): {one_line(exc)}"
                ) from exc
            conn.commit()

    def write(self, body: Callable[[Connection], T]) -> T:
        """``body`` in one write transaction, run once more on a fresh connection if the first
        was found dead before its COMMIT (a server restart killed the pooled connection)."""
        try:
            with self.transaction() as conn:
                return body(conn)
        except ConnectionLost as exc:
            log.info("%s; running the transaction again on a new connection", exc)
        with self.transaction() as conn:
            return body(conn)

    def batches(self) -> GroupCommit | None:
        """Where ``decisions.decide`` queues its calls to share a COMMIT; None: it does not."""
        return None

    @contextmanager
    def reading(self) -> Iterator[Connection]:
        """A read-only transaction (never takes the write lock)."""
        self._guard()
        with map_driver_errors(f"ledger at {self.location}"), self.engine.connect() as conn:
            if self.dialect == "sqlite":
                conn.exec_driver_sql("BEGIN")
            else:
                conn.begin()
            try:
                yield conn
            finally:
                conn.rollback()

    def ping(self) -> None:
        """Raise ``StoreError`` unless the ledger answers."""
        with self.reading() as conn:
            conn.execute(text("SELECT 1"))

    @property
    def skew(self) -> Skew | None:
        """How far this host's clock is from the ledger's (None: the ledger's is this host's)."""
        return self.clock.skew if isinstance(self.clock, LedgerClock) else None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.engine.dispose()

    def _guard(self) -> None:
        """Refuse to go on with a ledger that is no longer the one this process opened."""
        if self._lost is not None:
            raise self._lost

    def _lose(self, exc: LedgerLost) -> LedgerLost:
        self._lost = self._lost or exc  # said once by the caller (the proxy's health line)
        return self._lost

    # -- opening ---------------------------------------------------------------------------

    def _begin(self, conn: Connection) -> None:
        # The transaction must be SQLAlchemy's from the start: the hot statements run on the
        # driver connection (ledger._run), and a transaction SQLAlchemy never saw begin would
        # not be committed by it.
        if self.dialect == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")  # also SQLAlchemy's autobegin
        else:
            conn.begin()

    def _open(self, create: bool) -> str | None:
        if self.dialect == "sqlite":
            current = self._read_current()
            if current is not None:
                return current[0]
        with map_driver_errors(f"cannot open the ledger at {self.location}"):  # noqa: SIM117
            with self.engine.connect() as conn:
                self._begin(conn)
                if self.dialect == "postgresql":
                    # Many sidecars may start at once on an empty database: one migrates, the
                    # others wait here (longer than a decision may) and then find it current.
                    for name in ("statement_timeout", "lock_timeout"):
                        conn.exec_driver_sql(f"SET LOCAL {name} = '{OPEN_TIMEOUT}'")
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
                revision = _current_revision(conn)
                if revision == HEAD_REVISION:
                    found = ident.read_identity(conn)
                    conn.rollback()
                    return found
                if revision is not None and revision not in KNOWN_REVISIONS:
                    raise SchemaMismatch(
                        f"ledger at {self.location} has schema revision {revision}, newer than "
                        f"this ctrlrun knows ({HEAD_REVISION}); upgrade ctrlrun"
                    )
                if revision is None and inspect(conn).has_table("effects"):
                    raise SchemaMismatch(f"ledger at {self.location} is not a ctrlrun ledger")
                if not create and revision is None:
                    raise NoLedger(f"no ctrlrun ledger at {self.location}")
                # An older ledger is upgraded by whoever opens it first, a reader too: the
                # migrations are additive, and this code cannot read the older schema.
                _migrate(conn)
                found = ident.read_identity(conn)
                conn.commit()
                return found

    def _read_current(self) -> tuple[str | None] | None:
        """A current SQLite ledger's identity, read without the write lock (a reader opening
        it must not wait behind the writers); None when it may need creating or migrating."""
        with map_driver_errors(f"cannot open the ledger at {self.location}"):  # noqa: SIM117
            with self.engine.connect() as conn:
                conn.exec_driver_sql("BEGIN")
                try:
                    if _current_revision(conn) != HEAD_REVISION:
                        return None
                    return (ident.read_identity(conn),)
                finally:
                    conn.rollback()


def _current_revision(conn: Connection) -> str | None:
    if not inspect(conn).has_table("alembic_version"):
        return None
    row = conn.execute(text("SELECT version_num FROM alembic_version")).first()
    return None if row is None else str(row[0])


def _migrate(conn: Connection) -> None:
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, "head")


class SQLiteStateStore(StateStore):
    """The default ledger: one SQLite file (WAL, busy timeout, ``BEGIN IMMEDIATE``)."""

    def __init__(
        self, path: str | os.PathLike[str], *, create: bool = True, new: bool = False
    ) -> None:
        """``new``: a new ledger where the one created before is gone (``--create-ledger``)."""
        raw = os.fspath(path)
        if not raw or raw == ":memory:" or "mode=memory" in raw:
            raise InvalidArgument("SQLiteStateStore needs a file path, not an in-memory database")
        self.path = Path(raw)
        ident.check_at_start(self.path, new=new)
        if create or new:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        elif not self.path.exists():
            raise NoLedger(f"no ctrlrun ledger at {self.path}")
        # Not a string to parse: "?" or "#" in the path would be read as the URL's query.
        engine = create_engine(
            URL.create("sqlite", database=str(self.path)), connect_args={"timeout": 30}
        )
        event.listen(engine, "connect", sqlite_connect)
        self._checkpointer: Checkpointer | None = None
        self._anchor: sqlite3.Connection | None = None
        where = f"ledger at {engine.url.render_as_string(hide_password=True)}"
        self._writers = GroupCommit(engine.connect, begin_immediate, where=where)
        super().__init__(engine, create=create or new)
        try:
            self._watch_files(new=new, mark=create or new)
        except BaseException:
            self.close()
            raise

    def _undisturbed(self) -> bool:
        """Whether a batch may run on the loop: the ledger's files are still its own. A lost
        one is copied aside (a read of the whole file) on the decision thread instead."""
        return self._lost is None and self._watch.problem() is None

    def _watch_files(self, *, new: bool, mark: bool) -> None:
        ident.check_identity(self.path, self.ledger_id, new=new)
        # A connection held for the store's life keeps the file and WAL open (one inode each,
        # while it may write), so what it wrote can be read back if they are removed under it.
        self._anchor = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
        self._anchor.execute("SELECT count(*) FROM ledger_identity").fetchone()
        self._watch = ident.FileWatch.open(self.path)
        self._writers.here_ok = self._undisturbed
        if mark and self.ledger_id is not None:
            ident.write_marker(self.path, self.ledger_id)

    def _guard(self) -> None:
        super()._guard()
        what = self._watch.problem()
        if what is not None:
            rescued = None if self._anchor is None else ident.rescue(self._anchor, self.path)
            if self._checkpointer is not None:
                self._checkpointer.stop()  # never checkpoint into files that are not ours
            ident.note_lost(self.path, self.ledger_id, what, rescued)
            raise self._lose(LedgerLost(ident.lost_message(self.path, what, rescued)))

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        if self._checkpointer is None:
            # Writers leave checkpoints to a background thread: a checkpoint (with its fsync)
            # inside a decision's COMMIT would stall that one request by milliseconds.
            self._checkpointer = Checkpointer(self.path, self._watch.problem)
        self._guard()
        # This process's concurrent writers share one transaction and its COMMIT.
        with map_driver_errors(f"ledger at {self.location}"), self._writers.transaction() as conn:
            yield conn

    def batches(self) -> GroupCommit:
        return self._writers

    def close(self) -> None:
        self._writers.close()
        if self._checkpointer is not None:
            self._checkpointer.stop()
        if self._anchor is not None:
            self._anchor.close()
        super().close()


class PostgresStateStore(StateStore):
    """A ledger shared by many sidecars and hosts, on PostgreSQL through psycopg 3."""

    def __init__(self, url: str, *, create: bool = True) -> None:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise MissingDependency("psycopg", "postgres") from None
        parsed = parse_store_url(url)
        if parsed.drivername in ("postgresql", "postgres", "postgresql+psycopg"):
            parsed = parsed.set(drivername="postgresql+psycopg")
        else:
            raise InvalidArgument(f"not a PostgreSQL URL: {parsed.drivername}://…")
        parsed, self.timeouts = session_options(parsed)
        given = parsed.query.get("options")
        parsed = parsed.difference_update_query(["options"])
        options = options_string(self.timeouts, given if isinstance(given, str) else None)
        engine = create_engine(
            parsed,
            # A server restart leaves dead pooled connections: each checkout looks at its
            # socket and pings only one the server spoke on or that idled (pg_pool.py).
            pool_recycle=300,
            pool_size=10,
            max_overflow=20,
            connect_args={"connect_timeout": 5, "options": options},
        )
        check_on_checkout(engine)
        super().__init__(engine, create=create)
        try:
            self.clock = LedgerClock(self._database_now, bound=clock_skew_bound())
        except Exception:
            engine.dispose()
            raise
        # A database dropped and created afresh (and migrated by another sidecar) answers on
        # the same URL: each new session checks it reaches the ledger this store opened.
        event.listen(engine, "connect", self._check_session)

    def _database_now(self) -> datetime:
        # clock_timestamp(), not now(): now() is when the transaction began.
        with self.reading() as conn:
            value = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
        if not isinstance(value, datetime):  # pragma: no cover (psycopg gives timestamptz)
            raise StoreError(f"the ledger at {self.location} gave no time: {value!r}")
        return value

    def _check_session(self, dbapi_conn: Any, _record: Any) -> None:
        lost = ident.session_lost(dbapi_conn, self.ledger_id, self.location)
        if lost is not None:
            raise self._lose(lost)


def open_store(url: str, *, create: bool = True, new: bool = False) -> StateStore:
    """Open the ledger a URL names: ``sqlite:///path`` or ``postgresql[+psycopg]://…``.

    ``new``: create a SQLite ledger even where one was created before and is now missing or
    empty (the operator's ``--create-ledger``); an existing ledger is opened, never recreated.
    """
    parsed = parse_store_url(url)
    if parsed.drivername.startswith("sqlite"):
        return SQLiteStateStore(sqlite_file(parsed), create=create, new=new)
    if parsed.drivername.split("+")[0] in ("postgresql", "postgres"):
        try:
            return PostgresStateStore(url, create=create)
        except NoSuchModuleError:
            raise MissingDependency("psycopg", "postgres") from None
    raise InvalidArgument(
        f"unsupported store URL scheme {parsed.drivername!r}: use sqlite:///PATH or postgresql://…"
    )


def open_default_store(
    explicit: str | None = None,
    policy: str | os.PathLike[str] | None = None,
    *,
    create: bool = True,
    new: bool = False,
) -> StateStore:
    """The ledger the configuration names (``config.store_url``)."""
    return open_store(store_url(explicit, policy), create=create, new=new)
