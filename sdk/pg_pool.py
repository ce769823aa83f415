"""Pooled PostgreSQL connections checked without a round trip per checkout.

``pool_pre_ping`` sent a query before every transaction to find connections a server restart
had killed: a round trip per decision, two per protected call. A connection the server ended
(a restart, a failover, ``pg_terminate_backend``, an idle reaper) has something to read while
it sits idle in the pool: the server's last message (``57P01 terminating connection``) and the
end of the stream, or a reset. A healthy idle connection has nothing to read. So a checkout
looks at the socket (a ``poll`` with no wait) and pings only a connection that has something to
read, or that sat idle longer than ``IDLE_PING`` (a peer gone without a word: a dropped
network path). A ping that fails tells the pool to throw that connection away and open a new
one, as ``pool_pre_ping`` did; nothing is refused for a connection the pool could replace.
"""

from __future__ import annotations

import select
import time
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.exc import DisconnectionError

IDLE_PING = 1.0  # seconds in the pool after which a connection is pinged before use
_IDLE_SINCE = "ctrlrun_idle_since"


def check_on_checkout(engine: Engine, *, idle_ping: float = IDLE_PING) -> None:
    """Install the checks on ``engine``'s pool (instead of ``pool_pre_ping``)."""
    dialect = engine.dialect

    @event.listens_for(engine, "connect")
    def _fresh(_dbapi: Any, record: Any) -> None:
        record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkin")
    def _back(_dbapi: Any, record: Any) -> None:
        if record is not None:
            record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _out(dbapi: Any, record: Any, _proxy: Any) -> None:
        if dbapi.autocommit:  # a statement run as its own transaction was cut short (pg_hot)
            raise DisconnectionError("pooled connection left in autocommit")
        since = record.info.get(_IDLE_SINCE)
        stale = since is None or time.monotonic() - since > idle_ping
        if not stale and not has_input(dbapi):
            return
        try:
            dialect.do_ping(dbapi)
        except Exception as exc:  # a dead connection: the pool opens another one
            raise DisconnectionError(f"pooled connection is gone: {exc}") from exc


def has_input(dbapi: Any) -> bool:
    """Whether an idle connection's socket has something to read (or is closed)."""
    try:
        fd = dbapi.fileno()
    except Exception:  # closed on our side already
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))
