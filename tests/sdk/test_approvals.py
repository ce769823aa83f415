"""Approvals: requested, granted or denied by a human, bound to one action, single use, expiring."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sdk_support import Clock, events, receipts, run_cli

from ctrlrun import (
    ActionDenied,
    ApprovalMismatch,
    ApprovalRequired,
    Control,
    DuplicateEffect,
    NotExecuted,
    SQLiteStateStore,
    context,
    protect,
    with_approval,
)
from ctrlrun import ledger as L
from ctrlrun.action import utc_now
from ctrlrun.approvals import answer, check_consumable

APPROVE_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  wire:
    effect: "wire:{wire_id}"
    decision: approve
  approve_note:
    decision: approve
"""


def status(store: SQLiteStateStore, request_id: str) -> str:
    with store.reading() as conn:
        row = L.approval_row(conn, request_id)
    assert row is not None
    return str(row["status"])


def grant(store: SQLiteStateStore, request_id: str, *, ok: bool = True) -> None:
    with store.transaction() as conn:
        answer(conn, request_id, grant=ok, approver="test:human", now=utc_now())


class Wire:
    """The protected ``wire`` action, and the executions it made."""

    def __init__(self, control: Control) -> None:
        self.runs: list[tuple[str, int]] = []

        @protect("wire", control=control)
        def send(wire_id: str, amount: int) -> str:
            self.runs.append((wire_id, amount))
            return f"sent {wire_id}"

        self.send = send

    def __call__(self, wire_id: str, amount: int) -> str:
        return self.send(wire_id, amount)


@pytest.fixture
def wire(make_control: Callable[..., Control]) -> Wire:
    return Wire(make_control(APPROVE_POLICY))


def request(fn: Callable[..., Any], *args: Any) -> str:
    with context("bot"), pytest.raises(ApprovalRequired) as info:
        fn(*args)
    request_id = info.value.request_id
    assert re.fullmatch(r"apr_[0-9a-f]{32}", request_id)
    assert f"ctrlrun approve {request_id}" in str(info.value)
    return request_id


def test_cli_approve_then_runs_once_with_approval(
    wire: Wire, store: SQLiteStateStore, db_path: Path, tmp_path: Path
) -> None:
    request_id = request(wire, "w1", 900)
    assert receipts(store) == []  # nothing decided yet: no receipt while a human is asked
    assert status(store, request_id) == "pending"

    url = f"sqlite:///{db_path}"
    ran = run_cli(["approve", request_id, "--as", "alice", "--store-url", url], tmp_path)
    assert ran.code == 0, ran.err
    assert ran.out.startswith(f"granted {request_id} for sha256:")

    with context("bot"), with_approval(request_id):
        assert wire("w1", 900) == "sent w1"
    assert wire.runs == [("w1", 900)]
    (doc,) = receipts(store)
    assert doc["result"] == "committed" and doc["decision"] == "approve"
    assert doc["approval_id"] == request_id and doc["approver"] == "alice"
    assert status(store, request_id) == "consumed"
    types = [t for t, _ in events(store)]
    assert types.index("APPROVAL_GRANTED") < types.index("APPROVAL_CONSUMED")

    again = run_cli(["approve", request_id, "--store-url", f"sqlite:///{db_path}"], tmp_path)
    assert again.code == 1 and "consumed" in again.err


def test_changed_argument_is_a_mismatch_and_the_approval_stays_usable(
    wire: Wire, store: SQLiteStateStore
) -> None:
    request_id = request(wire, "w1", 900)
    grant(store, request_id)
    with context("bot"), with_approval(request_id):
        with pytest.raises(ApprovalMismatch) as info:
            wire("w1", 901)
        assert info.value.reason == "mismatch" and info.value.approval_id == request_id
        with pytest.raises(ApprovalMismatch):
            wire("w2", 900)
        assert status(store, request_id) == "granted"
        assert wire("w1", 900) == "sent w1"
    assert wire.runs == [("w1", 900)]
    assert [r["result"] for r in receipts(store)] == ["blocked", "blocked", "committed"]
    invalidated = [d for t, d in events(store) if t == "APPROVAL_INVALIDATED"]
    assert [d["reason"] for d in invalidated] == ["mismatch", "mismatch"]


@pytest.mark.parametrize("how", ["no_effect_key", "renewal_after_failure"])
def test_replay_is_refused_as_consumed(
    make_control: Callable[..., Control], store: SQLiteStateStore, how: str
) -> None:
    control = make_control(APPROVE_POLICY)
    runs: list[str] = []

    @protect("approve_note", control=control)
    def note(text: str) -> None:
        runs.append(text)

    @protect("wire", control=control)
    def wire(wire_id: str, amount: int) -> None:
        runs.append(wire_id)
        raise NotExecuted("bank offline")

    fn, args = (note, ("hello",)) if how == "no_effect_key" else (wire, ("w1", 5))
    request_id = request(fn, *args)
    grant(store, request_id)
    with context("bot"), with_approval(request_id):
        if how == "no_effect_key":
            fn(*args)
        else:
            with pytest.raises(NotExecuted):
                fn(*args)
        with pytest.raises(ApprovalMismatch) as info:
            fn(*args)
    assert info.value.reason == "consumed"
    assert len(runs) == 1


def test_expired_approval_is_refused(wire: Wire, store: SQLiteStateStore, clock: Clock) -> None:
    request_id = request(wire, "w1", 900)
    grant(store, request_id)
    clock.advance(minutes=15, seconds=1)
    with context("bot"), with_approval(request_id), pytest.raises(ApprovalMismatch) as info:
        wire("w1", 900)
    assert info.value.reason == "expired"
    assert wire.runs == []
    assert status(store, request_id) == "expired"


def test_just_before_expiry_it_still_works(
    wire: Wire, store: SQLiteStateStore, clock: Clock
) -> None:
    request_id = request(wire, "w1", 900)
    grant(store, request_id)
    clock.advance(minutes=14, seconds=59)
    with context("bot"), with_approval(request_id):
        wire("w1", 900)
    assert wire.runs == [("w1", 900)]


def test_cli_deny_then_presenting_is_denied_with_receipt(
    wire: Wire, store: SQLiteStateStore, db_path: Path, tmp_path: Path
) -> None:
    request_id = request(wire, "w1", 900)
    url = f"sqlite:///{db_path}"
    ran = run_cli(["deny", request_id, "--as", "carol", "--store-url", url], tmp_path)
    assert ran.code == 0 and ran.out.strip() == f"denied {request_id} by carol"
    with context("bot"), with_approval(request_id), pytest.raises(ActionDenied) as info:
        wire("w1", 900)
    assert info.value.reason == "approval_denied"
    assert wire.runs == []
    (doc,) = receipts(store)
    assert doc["result"] == "denied" and doc["approval_id"] == request_id


@pytest.mark.parametrize(
    ("setup", "reason"),
    [("unknown", "unknown"), ("pending", "pending")],
)
def test_unusable_approvals(wire: Wire, store: SQLiteStateStore, setup: str, reason: str) -> None:
    request_id = request(wire, "w1", 900) if setup == "pending" else "apr_" + "0" * 32
    with context("bot"), with_approval(request_id), pytest.raises(ApprovalMismatch) as info:
        wire("w1", 900)
    assert info.value.reason == reason
    assert wire.runs == []


def test_refused_reservation_leaves_the_approval_granted(
    wire: Wire, store: SQLiteStateStore
) -> None:
    first = request(wire, "w1", 900)
    grant(store, first)
    with context("bot"), with_approval(first):
        wire("w1", 900)
    second = request(wire, "w1", 900)
    grant(store, second)
    with context("bot"), with_approval(second), pytest.raises(DuplicateEffect):
        wire("w1", 900)
    assert status(store, second) == "granted"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("grant_it", [True, False], ids=["approved", "denied"])
def test_wait_blocks_until_a_human_answers(
    make_control: Callable[..., Control], store: SQLiteStateStore, grant_it: bool
) -> None:
    control = make_control(APPROVE_POLICY)
    runs: list[str] = []

    @protect("wire", wait=True, control=control)
    def wire(wire_id: str, amount: int) -> str:
        runs.append(wire_id)
        return "sent"

    answered: list[str] = []

    def human() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with store.reading() as conn:
                pending = L.pending_approvals(conn)
            if pending:
                time.sleep(0.3)  # the caller is now blocked in wait
                grant(store, pending[0]["approval_id"], ok=grant_it)
                answered.append(pending[0]["approval_id"])
                return
            time.sleep(0.05)

    thread = threading.Thread(target=human)
    thread.start()
    try:
        with context("bot"):
            if grant_it:
                assert wire("w1", 900) == "sent"
            else:
                with pytest.raises(ActionDenied) as info:
                    wire("w1", 900)
                assert info.value.reason == "approval_denied"
    finally:
        thread.join(timeout=15)
    assert len(answered) == 1
    assert runs == (["w1"] if grant_it else [])
    (doc,) = receipts(store)
    assert doc["approval_id"] == answered[0]
    assert doc["result"] == ("committed" if grant_it else "denied")


# (id, row, presented hash, seconds after expiry (negative: before), reason)
ROW = {"action_hash": "sha256:a", "status": "granted", "expires_at": "2026-01-01T00:15:00.000Z"}
CONSUMABLE: list[tuple[str, dict[str, Any] | None, str, str | None]] = [
    ("ok", ROW, "sha256:a", None),
    ("unknown", None, "sha256:a", "unknown"),
    ("mismatch_first", {**ROW, "status": "denied"}, "sha256:b", "mismatch"),
    ("denied", {**ROW, "status": "denied"}, "sha256:a", "denied"),
    ("pending", {**ROW, "status": "pending"}, "sha256:a", "pending"),
    ("consumed", {**ROW, "status": "consumed"}, "sha256:a", "consumed"),
    ("expired_status", {**ROW, "status": "expired"}, "sha256:a", "expired"),
    ("past_expiry", {**ROW, "expires_at": "2025-12-31T23:59:59.000Z"}, "sha256:a", "expired"),
]


@pytest.mark.parametrize(
    ("row", "presented", "reason"), [c[1:] for c in CONSUMABLE], ids=[c[0] for c in CONSUMABLE]
)
def test_check_consumable(row: dict[str, Any] | None, presented: str, reason: str | None) -> None:
    from ctrlrun.action import parse_iso

    now = parse_iso("2026-01-01T00:00:00.000Z")
    assert check_consumable(row, "apr_x", presented, now) == reason


def test_answering_an_expired_request_is_refused(wire: Wire, store: SQLiteStateStore) -> None:
    from datetime import timedelta

    request_id = request(wire, "w1", 900)
    with store.transaction() as conn, pytest.raises(ApprovalMismatch) as info:
        answer(conn, request_id, grant=True, approver="x", now=utc_now() + timedelta(minutes=16))
    assert info.value.reason == "expired"


def test_with_approval_needs_an_id() -> None:
    from ctrlrun import InvalidArgument

    with pytest.raises(InvalidArgument), with_approval(""):
        pass


HEADER_POLICY = (
    APPROVE_POLICY
    + """\
  wire_by_id:
    effect: "wire-by-id:{wire_id}"
    decision: approve
    approval: header
"""
)


def test_the_identical_call_consumes_a_granted_approval_without_naming_it(
    wire: Wire, store: SQLiteStateStore
) -> None:
    request_id = request(wire, "w1", 900)
    assert "call again with the identical arguments" in str(
        ApprovalRequired(request_id, resend=True)
    )
    grant(store, request_id)
    with context("bot"):
        assert wire("w1", 900) == "sent w1"
    assert wire.runs == [("w1", 900)]
    assert status(store, request_id) == "consumed"
    (doc,) = receipts(store)
    assert doc["result"] == "committed" and doc["approval_id"] == request_id
    # Used once: the same call again is a new request (and then refused as a duplicate).
    with context("bot"), pytest.raises(ApprovalRequired) as info:
        wire("w1", 900)
    assert info.value.request_id != request_id


def test_a_changed_call_or_another_principal_does_not_consume_it(
    wire: Wire, store: SQLiteStateStore
) -> None:
    request_id = request(wire, "w1", 900)
    grant(store, request_id)
    for who, args in (("bot", ("w1", 901)), ("bot", ("w2", 900)), ("other-bot", ("w1", 900))):
        with context(who), pytest.raises(ApprovalRequired) as info:
            wire(*args)
        assert info.value.request_id != request_id and info.value.resend
    assert wire.runs == [] and status(store, request_id) == "granted"
    with context("bot"):
        wire("w1", 900)
    assert wire.runs == [("w1", 900)]


def test_an_expired_or_denied_approval_is_not_consumed_by_a_resend(
    wire: Wire, store: SQLiteStateStore, clock: Clock
) -> None:
    denied = request(wire, "w1", 900)
    grant(store, denied, ok=False)
    with context("bot"), pytest.raises(ApprovalRequired):
        wire("w1", 900)
    expired = request(wire, "w2", 900)
    grant(store, expired)
    clock.advance(minutes=15, seconds=1)
    with context("bot"), pytest.raises(ApprovalRequired):
        wire("w2", 900)
    assert wire.runs == []
    assert status(store, denied) == "denied" and status(store, expired) == "granted"


def test_approval_header_requires_the_approval_to_be_presented(
    make_control: Callable[..., Control], store: SQLiteStateStore
) -> None:
    control = make_control(HEADER_POLICY)
    runs: list[str] = []

    @protect("wire_by_id", control=control)
    def wire(wire_id: str) -> None:
        runs.append(wire_id)

    request_id = request(wire, "w1")
    grant(store, request_id)
    with context("bot"), pytest.raises(ApprovalRequired) as info:
        wire("w1")
    assert not info.value.resend and "with_approval" in str(info.value)
    assert runs == [] and status(store, request_id) == "granted"
    with context("bot"), with_approval(request_id):
        wire("w1")
    assert runs == ["w1"]
