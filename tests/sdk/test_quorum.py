"""Quorum approvals: ``approvals_required: N`` means N different operators, one deny denies."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sdk_support import events, receipts, run_cli

from ctrlrun import (
    ApprovalMismatch,
    ApprovalRequired,
    Control,
    Policy,
    PolicyError,
    SQLiteStateStore,
    context,
    protect,
)
from ctrlrun import ledger as L
from ctrlrun.action import utc_now
from ctrlrun.approvals import answer, approvers
from ctrlrun.store import PostgresStateStore, StateStore

QUORUM_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  wire:
    effect: "wire:{wire_id}"
    decision: approve
    approvals_required: 2
  note:
    decision: approve
operators:
  alice: {token_env: OPERATOR_ALICE}
  bob: {token_env: OPERATOR_BOB}
  carol: {token_env: OPERATOR_CAROL}
"""


def ask(control: Control, wire_id: str = "w1", amount: int = 900) -> str:
    """Run the protected ``wire`` once as ``bot``; the approval request it gets."""

    @protect("wire", control=control)
    def wire(wire_id: str, amount: int) -> str:
        return f"sent {wire_id}"

    with context("bot"), pytest.raises(ApprovalRequired) as info:
        wire(wire_id, amount)
    return info.value.request_id


def vote(store: StateStore, request_id: str, who: str, *, ok: bool = True) -> dict[str, Any]:
    with store.transaction() as conn:
        return dict(answer(conn, request_id, grant=ok, approver=who, now=utc_now()))


def row(store: StateStore, request_id: str) -> dict[str, Any]:
    with store.reading() as conn:
        found = L.approval_row(conn, request_id)
    assert found is not None
    return dict(found)


def granted_events(store: SQLiteStateStore) -> list[dict[str, Any]]:
    return [data for t, data in events(store) if t == "APPROVAL_GRANTED"]


def test_two_different_operators_grant_it_and_the_receipt_names_both(
    make_control: Callable[..., Control], store: SQLiteStateStore
) -> None:
    control = make_control(QUORUM_POLICY)
    request_id = ask(control)
    assert row(store, request_id)["approvals_required"] == 2

    first = vote(store, request_id, "alice")
    assert first["status"] == "pending" and first["approvals"] == ["alice"]
    assert row(store, request_id)["status"] == "pending"
    assert granted_events(store) == []  # nobody is told "granted" before the quorum
    with pytest.raises(ApprovalMismatch) as twice:
        vote(store, request_id, "alice")
    assert twice.value.reason == "already_approved"
    assert "alice already approved" in str(twice.value) and "1 of 2 approvals" in str(twice.value)
    assert row(store, request_id)["status"] == "pending"  # the same operator counts once

    second = vote(store, request_id, "bob")
    assert second["status"] == "granted" and second["approver"] == "alice, bob"
    (granted,) = granted_events(store)
    assert granted["approvers"] == ["alice", "bob"]
    voted = [data for t, data in events(store) if t == "APPROVAL_VOTED"]
    assert voted == [{"approver": "alice", "approvals": 1, "approvals_required": 2}]

    # The identical call, re-sent, consumes it; its receipt names every approver.
    @protect("wire", control=control)
    def wire(wire_id: str, amount: int) -> str:
        return f"sent {wire_id}"

    with context("bot"):
        assert wire("w1", 900) == "sent w1"
    (doc,) = receipts(store)
    assert doc["result"] == "committed" and doc["approver"] == "alice, bob"
    with pytest.raises(ApprovalMismatch, match="consumed"):
        vote(store, request_id, "carol")


def test_one_deny_denies_even_after_an_approval(
    make_control: Callable[..., Control], store: SQLiteStateStore
) -> None:
    control = make_control(QUORUM_POLICY)
    request_id = ask(control)
    vote(store, request_id, "alice")
    denied = vote(store, request_id, "bob", ok=False)
    assert denied["status"] == "denied" and denied["approver"] == "bob"
    assert row(store, request_id)["status"] == "denied"
    with pytest.raises(ApprovalMismatch, match="denied"):
        vote(store, request_id, "carol")
    assert granted_events(store) == []
    (data,) = [d for t, d in events(store) if t == "APPROVAL_DENIED"]
    assert data["approver"] == "bob" and data["approvers"] == ["alice"]

    @protect("wire", control=control)
    def wire(wire_id: str, amount: int) -> str:
        return "sent"

    with context("bot"), pytest.raises(ApprovalRequired) as info:
        wire("w1", 900)  # the identical call meets no granted approval: a new request
    assert info.value.request_id != request_id
    with store.reading() as conn:
        assert approvers(conn, request_id) == ["alice"]


def test_an_action_without_a_quorum_is_granted_by_one(
    make_control: Callable[..., Control], store: SQLiteStateStore
) -> None:
    control = make_control(QUORUM_POLICY)

    @protect("note", control=control)
    def note() -> str:
        return "ok"

    with context("bot"), pytest.raises(ApprovalRequired) as info:
        note()
    request_id = info.value.request_id
    assert row(store, request_id)["approvals_required"] == 1
    assert vote(store, request_id, "alice")["status"] == "granted"
    assert granted_events(store)[0]["approver"] == "alice"


def test_the_cli_says_how_many_approvals_are_missing(
    make_control: Callable[..., Control], store: SQLiteStateStore, db_path: Path, tmp_path: Path
) -> None:
    control = make_control(QUORUM_POLICY)
    request_id = ask(control)
    url = ["--store-url", f"sqlite:///{db_path}"]

    first = run_cli(["approve", request_id, "--as", "alice", *url], tmp_path)
    assert first.code == 0, first.err
    assert first.out.strip() == (
        f"approved {request_id} by alice: 1 of 2 approvals; waiting for another operator"
    )
    listed = run_cli(["approvals", *url], tmp_path)
    assert "approved by alice (1 of 2 approvals; waiting for another operator)" in listed.out
    as_json = json.loads(run_cli(["approvals", "--json", *url], tmp_path).out)
    assert as_json["approvals_required"] == 2 and as_json["approvers"] == ["alice"]

    again = run_cli(["approve", request_id, "--as", "alice", *url], tmp_path)
    assert again.code == 1 and "alice already approved" in again.err

    second = run_cli(["approve", request_id, "--as", "bob", *url], tmp_path)
    assert second.code == 0, second.err
    assert second.out.startswith(f"granted {request_id} for sha256:")
    assert "by alice, bob" in second.out

    with store.reading() as conn:
        action_id = conn.exec_driver_sql(
            "SELECT action_id FROM events WHERE type = 'APPROVAL_REQUESTED'"
        ).scalar()
    shown = run_cli(["inspect", action_id, *url], tmp_path)
    assert shown.code == 0, shown.err
    assert f"approval   {request_id}  granted  by alice, bob  (2 of 2 approvals)" in shown.out
    found = json.loads(run_cli(["inspect", action_id, "--json", *url], tmp_path).out)
    (approval,) = found["approvals"]
    assert [(v["operator"], v["decision"]) for v in approval["votes"]] == [
        ("alice", "grant"),
        ("bob", "grant"),
    ]


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("decision: approve\n    approvals_required: 0", "must be a whole number from 1 to 20"),
        ("decision: approve\n    approvals_required: true", "got True"),
        ("decision: approve\n    approvals_required: '2'", "must be a whole number"),
        ("decision: approve\n    approvals_required: 21", "from 1 to 20"),
        ("decision: allow\n    approvals_required: 2", "never asks for approval"),
    ],
)
def test_a_bad_quorum_is_one_clear_line(entry: str, says: str) -> None:
    text = f"schema: ctrlrun.policy/v2\nactions:\n  wire:\n    {entry}\n"
    with pytest.raises(PolicyError) as info:
        Policy.from_yaml(text)
    message = str(info.value)
    assert "\n" not in message and says in message
    assert "<string>:5: actions.wire.approvals_required" in message


def test_a_quorum_larger_than_the_operators_is_refused() -> None:
    text = (
        "schema: ctrlrun.policy/v2\nactions:\n  wire:\n    decision: approve\n"
        "    approvals_required: 3\noperators:\n  alice: {token_env: A}\n  bob: {token_env: B}\n"
    )
    with pytest.raises(PolicyError, match=r"<string>:5: .*3 approvals can never be given"):
        Policy.from_yaml(text)
    assert Policy.from_yaml(text.replace("required: 3", "required: 2")).actions["wire"]


def test_a_quorum_without_operators_is_refused() -> None:
    # Without operators: any --as name counts, and one person could approve twice.
    text = "schema: ctrlrun.policy/v2\nactions:\n  wire:\n    decision: approve\n"
    with pytest.raises(PolicyError, match=r"<string>:5: .*needs an operators: section"):
        Policy.from_yaml(text + "    approvals_required: 2\n")
    assert Policy.from_yaml(text + "    approvals_required: 1\n").actions["wire"]


def test_quorum_needs_schema_v2() -> None:
    text = "schema: ctrlrun.policy/v1\nactions:\n  w: {decision: approve, approvals_required: 2}\n"
    with pytest.raises(PolicyError, match="needs schema"):
        Policy.from_yaml(text)


ROUNDS = 12


def race(store: StateStore, request_id: str, who: tuple[str, str]) -> list[str]:
    """Two operators answer ``request_id`` at the same moment; what each was told."""
    start = threading.Barrier(2)
    seen: list[str] = []

    def operator(name: str) -> None:
        start.wait(timeout=10)
        try:
            seen.append(vote(store, request_id, name)["status"])
        except ApprovalMismatch as exc:
            seen.append(exc.reason)

    threads = [threading.Thread(target=operator, args=(n,)) for n in who]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return sorted(seen)


@pytest.mark.parametrize("who", [("alice", "bob"), ("alice", "alice")])
def test_two_operators_approving_at_once_on_postgres_grant_it_once(
    pg_url: str, who: tuple[str, str]
) -> None:
    store = PostgresStateStore(pg_url)
    try:
        control = Control(Policy.from_yaml(QUORUM_POLICY), store)
        ids = [ask(control, f"w{i}") for i in range(ROUNDS)]
        outcomes = [race(store, request_id, who) for request_id in ids]
        with store.reading() as conn:
            rows = [L.approval_row(conn, i) for i in ids]
            granted = conn.exec_driver_sql(
                "SELECT count(*) FROM events WHERE type = 'APPROVAL_GRANTED'"
            ).scalar()
        if who[0] != who[1]:
            assert outcomes == [["granted", "pending"]] * ROUNDS
            assert all(r is not None and r["status"] == "granted" for r in rows)
            assert {r["approver"] for r in rows if r} <= {"alice, bob", "bob, alice"}
            assert granted == ROUNDS  # exactly once per request
        else:
            assert outcomes == [["already_approved", "pending"]] * ROUNDS
            assert all(r is not None and r["status"] == "pending" for r in rows)
            assert granted == 0
    finally:
        store.close()


def test_the_console_shows_a_quorum_in_progress(
    make_control: Callable[..., Control], store: SQLiteStateStore
) -> None:
    from ctrlrun.console import acts, board

    request_id = ask(make_control(QUORUM_POLICY))
    said = acts.decide(store, request_id, grant=True, operator="alice")
    waiting = "1 of 2 approvals; waiting for another operator"
    assert said == f"{request_id}: approved by alice: {waiting}"
    with store.reading() as conn:
        (shown,) = board.pending(conn, utc_now())
    assert shown.approved_by == ("alice",)
    assert acts.decide(store, request_id, grant=True, operator="bob").startswith(
        f"granted {request_id}"
    )
