"""Webhook deliveries on PostgreSQL, where event ids commit out of order: an event whose
transaction commits after a later id's is still delivered, once, in order; an id that never
commits (a rolled-back transaction) does not hold the others back for ever."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import text

from ctrlrun.events import EventType
from ctrlrun.ledger import append_event
from ctrlrun.proxy.notifier import Notifier
from ctrlrun.proxy.notify import NAMES, Webhook
from ctrlrun.proxy.notify_horizon import Horizon
from ctrlrun.store import StateStore, open_store

from .conftest import pg_admin


class Receiver:
    """A webhook receiver on loopback that records the approval id of each delivery."""

    def __init__(self) -> None:
        self.got: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.got.append(json.loads(body)["approval_id"])
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, n: int, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while len(self.got) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return list(self.got)


@pytest.fixture
def store(pg_url: str) -> Iterator[StateStore]:
    s = open_store(pg_url)
    yield s
    s.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


def running(store: StateStore, receiver: Receiver, **kw: Any) -> Notifier:
    """A notifier sending every event to ``receiver``, once its cursor exists."""
    hook = Webhook(receiver.url, "CTRLRUN_GAPS_SECRET", frozenset(NAMES))
    notifier = Notifier(store, [hook], interval=0.05, **kw).start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with store.reading() as conn:
            if conn.execute(text("SELECT count(*) FROM notify_cursors")).scalar():
                return notifier
        time.sleep(0.05)
    notifier.stop()
    raise AssertionError("the notifier made no cursor within 5 s")


def requested(store: StateStore, approval_id: str) -> None:
    with store.transaction() as conn:
        append_event(conn, datetime.now(UTC), EventType.APPROVAL_REQUESTED, approval_id=approval_id)


def in_open_transaction(store: StateStore, approval_id: str, *, commit: bool) -> Any:
    """Write an event in a transaction held open until ``release()``; then commit or roll back."""
    written, release = threading.Event(), threading.Event()

    def writer() -> None:
        try:
            with store.transaction() as conn:
                append_event(
                    conn, datetime.now(UTC), EventType.APPROVAL_REQUESTED, approval_id=approval_id
                )
                written.set()
                release.wait(10)
                if not commit:
                    raise RuntimeError("rolled back on purpose")
        except RuntimeError:
            pass

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    assert written.wait(5), "the first writer never wrote its event"

    def finish() -> None:
        release.set()
        thread.join(10)

    return finish


@pytest.fixture(autouse=True)
def secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTRLRUN_GAPS_SECRET", "whsec_gaps_0123456789")


def test_an_event_committed_after_a_later_one_is_delivered_once_in_order(
    store: StateStore, receiver: Receiver
) -> None:
    notifier = running(store, receiver)
    try:
        finish = in_open_transaction(store, "apr_first", commit=True)  # the lower id
        requested(store, "apr_second")  # the higher id, committed first
        time.sleep(2.0)  # the notifier polls about 40 times while the lower id is open
        early = list(receiver.got)
        finish()
        receiver.wait_for(2, timeout=5.0)
        time.sleep(0.5)  # anything sent twice would have arrived by now
    finally:
        notifier.stop()
    assert sorted(receiver.got) == ["apr_first", "apr_second"]  # both, once each
    assert early == [] and receiver.got == ["apr_first", "apr_second"]  # in order


def test_a_rolled_back_id_does_not_hold_the_next_events(
    store: StateStore, receiver: Receiver
) -> None:
    notifier = running(store, receiver, horizon=Horizon(limit=120.0))
    try:
        finish = in_open_transaction(store, "apr_lost", commit=False)
        requested(store, "apr_after")
        finish()
        asked = time.monotonic()
        got = receiver.wait_for(1, timeout=30.0)
        waited = time.monotonic() - asked
    finally:
        notifier.stop()
    assert got == ["apr_after"]
    # The gap is known dead once its transaction has ended (about GRACE later), not at the
    # limit; slack for other sessions on a shared server, whose transactions also hold xmin.
    assert waited < 30.0


def test_a_gap_held_back_by_a_foreign_transaction_is_passed_after_the_limit(
    store: StateStore, receiver: Receiver
) -> None:
    # A session outside the ledger (here a psql-like connection to another database) keeps an
    # xid open: the server's oldest transaction does not move, so only the limit passes the gap.
    with pg_admin() as other:
        other.autocommit = False
        other.execute("SELECT pg_current_xact_id()")
        notifier = running(store, receiver, horizon=Horizon(grace=0.2, limit=2.0))
        try:
            finish = in_open_transaction(store, "apr_lost", commit=False)
            requested(store, "apr_after")
            finish()
            time.sleep(1.0)
            assert receiver.got == []  # not yet: it cannot prove the gap dead
            got = receiver.wait_for(1, timeout=10.0)
        finally:
            notifier.stop()
            other.rollback()
    assert got == ["apr_after"]


def test_a_new_webhook_gets_an_event_whose_lower_id_commits_after_it_started(
    store: StateStore, receiver: Receiver
) -> None:
    requested(store, "apr_history")  # before the webhook: not sent
    finish = in_open_transaction(store, "apr_open", commit=True)  # the lower id, still open
    requested(store, "apr_newest")  # the higher id, visible when the webhook's cursor is made
    notifier = running(store, receiver)
    try:
        finish()
        receiver.wait_for(2, timeout=10.0)
        time.sleep(0.5)  # anything sent twice would have arrived by now
    finally:
        notifier.stop()
    # The cursor began below the open id, not at the newest event: the open one is not lost.
    assert receiver.got == ["apr_open", "apr_newest"]


def test_a_new_webhook_with_no_transaction_running_starts_at_the_newest_event(
    store: StateStore, receiver: Receiver
) -> None:
    finish = in_open_transaction(store, "apr_rolled_back", commit=False)
    requested(store, "apr_before")
    finish()  # its id is a gap for ever, and nothing that could fill it runs
    notifier = running(store, receiver)
    try:
        requested(store, "apr_after")
        got = receiver.wait_for(1, timeout=10.0)
        time.sleep(0.5)
    finally:
        notifier.stop()
    assert got == ["apr_after"] and receiver.got == ["apr_after"]  # no history
