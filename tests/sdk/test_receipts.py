"""Receipts: the document, the hash chain, and ``ctrlrun receipts --verify-chain``."""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from sdk_support import invoke, receipts, run_cli

from ctrlrun import ActionDenied, Control, NotExecuted, SQLiteStateStore, context, protect
from ctrlrun.receipts import receipt_hash, verify_chain
from ctrlrun.schema import GENESIS_HASH

FIELDS = {
    "schema",
    "receipt_id",
    "action_id",
    "action",
    "action_hash",
    "arguments",
    "principal",
    "resource",
    "environment",
    "decision",
    "decision_reason",
    "approval_id",
    "approver",
    "effect_key",
    "attempt",
    "result",
    "error",
    "policy_hash",
    "started_at",
    "finished_at",
    "seq",
    "prev_hash",
}
TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def fill(control: Control) -> None:
    """Five receipts: committed, failed, blocked, denied, committed."""

    @protect("refund", control=control)
    def refund(payment_id: str, amount: int) -> str:
        if payment_id == "p_fail":
            raise NotExecuted("card declined before sending")
        return "ok"

    @protect("delete", control=control)
    def delete(name: str) -> None:
        raise AssertionError("denied actions never run")

    with context("bot", "u1"):
        refund(payment_id="p1", amount=100)
        with pytest.raises(NotExecuted):
            refund(payment_id="p_fail", amount=100)
        with pytest.raises(Exception, match="already committed"):
            refund(payment_id="p1", amount=100)
        with pytest.raises(ActionDenied):
            delete(name="prod")
        refund(payment_id="p2", amount=100)


def test_receipt_documents_and_chain(control: Control, store: SQLiteStateStore) -> None:
    fill(control)
    docs = receipts(store)
    assert [d["result"] for d in docs] == ["committed", "failed", "blocked", "denied", "committed"]
    with store.reading() as conn:
        digests = [r[0] for r in conn.exec_driver_sql("SELECT hash FROM receipts ORDER BY seq")]
    prev = GENESIS_HASH
    for seq, (doc, digest) in enumerate(zip(docs, digests, strict=True), 1):
        assert set(doc) - {"trace_id"} == FIELDS  # trace_id: only in a traced call
        assert doc["schema"] == "ctrlrun.receipt/v3"
        assert re.fullmatch(r"ctr_[0-9a-f]{32}", doc["receipt_id"])
        assert re.fullmatch(r"act_[0-9a-f]{32}", doc["action_id"])
        assert re.fullmatch(TS, doc["started_at"]) and re.fullmatch(TS, doc["finished_at"])
        assert doc["principal"] == {"agent": "bot", "user": "u1"}
        assert doc["seq"] == seq and doc["prev_hash"] == prev
        assert receipt_hash(doc) == digest
        prev = digest
    assert docs[1]["error"] == "NotExecuted: card declined before sending"
    assert docs[3]["decision"] == "deny" and docs[3]["effect_key"] == "delete:prod"
    with store.reading() as conn:
        report = verify_chain(conn)
    assert report.ok and report.verified == 5 and report.head_seq == 5


def _alter_value(db: sqlite3.Connection) -> None:
    body = db.execute("SELECT json FROM receipts WHERE seq = 2").fetchone()[0]
    db.execute(
        "UPDATE receipts SET json = ? WHERE seq = 2",
        (body.replace('"result":"failed"', '"result":"committed"'),),
    )


def _alter_to_float(db: sqlite3.Connection) -> None:
    body = json.loads(db.execute("SELECT json FROM receipts WHERE seq = 1").fetchone()[0])
    body["arguments"]["amount"] = 100.5
    db.execute("UPDATE receipts SET json = ? WHERE seq = 1", (json.dumps(body),))


def _alter_to_garbage(db: sqlite3.Connection) -> None:
    db.execute("UPDATE receipts SET json = '[1, 2]' WHERE seq = 3")


def _alter_to_bad_json(db: sqlite3.Connection) -> None:
    db.execute("UPDATE receipts SET json = substr(json, 1, 20) WHERE seq = 4")


def _delete_middle(db: sqlite3.Connection) -> None:
    db.execute("DELETE FROM receipts WHERE seq = 3")


def _delete_last(db: sqlite3.Connection) -> None:
    db.execute("DELETE FROM receipts WHERE seq = 5")


def _swap(db: sqlite3.Connection) -> None:
    db.execute("UPDATE receipts SET seq = -2 WHERE seq = 2")
    db.execute("UPDATE receipts SET seq = 2 WHERE seq = 4")
    db.execute("UPDATE receipts SET seq = 4 WHERE seq = -2")


# (id, tamper, a break name the report must contain, the seq it must name)
TAMPERS: list[tuple[str, Callable[[sqlite3.Connection], None], str, int]] = [
    ("altered_value", _alter_value, "content_altered", 2),
    ("altered_to_float", _alter_to_float, "content_altered", 1),
    ("altered_to_non_object", _alter_to_garbage, "unreadable", 3),
    ("altered_to_bad_json", _alter_to_bad_json, "unreadable", 4),
    ("deleted_middle", _delete_middle, "missing", 3),
    ("deleted_last", _delete_last, "head_mismatch", 5),
    ("reordered", _swap, "link_broken", 2),
]


@pytest.mark.parametrize(
    ("tamper", "name", "seq"), [t[1:] for t in TAMPERS], ids=[t[0] for t in TAMPERS]
)
def test_verify_chain_names_the_break(
    control: Control,
    store: SQLiteStateStore,
    db_path: Path,
    tmp_path: Path,
    tamper: Callable[[sqlite3.Connection], None],
    name: str,
    seq: int,
) -> None:
    fill(control)
    url = f"sqlite:///{db_path}"
    intact = invoke(["receipts", "--verify-chain", "--store-url", url], tmp_path)
    assert intact.code == 0, intact.err
    assert "chain: 5 receipts" in intact.out and "chain intact" in intact.out

    with sqlite3.connect(db_path) as db:
        tamper(db)
    with store.reading() as conn:
        report = verify_chain(conn)
    assert not report.ok
    assert (name, seq) in {(b.name, b.seq) for b in report.breaks}, report.breaks

    broken = run_cli(["receipts", "--verify-chain", "--store-url", url], tmp_path)
    assert broken.code == 1, broken.err
    assert f"seq {seq}: {name.replace('_', ' ')}" in broken.out
    assert "chain intact" not in broken.out


def _new_hash_for_second(db: sqlite3.Connection) -> None:
    db.execute("UPDATE receipts SET hash = 'sha256:' || hex(zeroblob(32)) WHERE seq = 2")


def _delete_second(db: sqlite3.Connection) -> None:
    db.execute("DELETE FROM receipts WHERE seq = 2")


def test_a_walk_of_the_newest_counts_from_the_head(
    control: Control, store: SQLiteStateStore
) -> None:
    fill(control)
    with store.reading() as conn:
        newest = verify_chain(conn, newest=3)
        assert newest.ok and (newest.verified, newest.first_seq, newest.head_seq) == (3, 3, 5)
        for walk in (5, 50):
            whole = verify_chain(conn, newest=walk)
            assert whole.ok and (whole.verified, whole.first_seq) == (5, 1)


# (id, tamper, what a walk of the newest three (seq 3 to 5) must name; None: nothing)
NEWEST_THREE: list[tuple[str, Callable[[sqlite3.Connection], None], tuple[str, int] | None]] = [
    ("older_altered", _alter_value, None),
    ("altered_inside", _alter_to_bad_json, ("unreadable", 4)),
    ("deleted_first_inside", _delete_middle, ("missing", 3)),
    ("deleted_last", _delete_last, ("head_mismatch", 5)),
    ("link_into_the_walk", _new_hash_for_second, ("link_broken", 3)),
    ("deleted_before_the_walk", _delete_second, ("missing", 2)),
]


@pytest.mark.parametrize(
    ("tamper", "found"), [t[1:] for t in NEWEST_THREE], ids=[t[0] for t in NEWEST_THREE]
)
def test_a_walk_of_the_newest_checks_them_and_their_link_to_the_one_before(
    control: Control,
    store: SQLiteStateStore,
    db_path: Path,
    tamper: Callable[[sqlite3.Connection], None],
    found: tuple[str, int] | None,
) -> None:
    fill(control)
    with sqlite3.connect(db_path) as db:
        tamper(db)
    with store.reading() as conn:
        newest = verify_chain(conn, newest=3)
        assert not verify_chain(conn).ok  # the whole walk finds every one of them
    names = {(b.name, b.seq) for b in newest.breaks}
    assert names == set() if found is None else found in names, newest.breaks


def test_reordering_named_as_such(control: Control, store: SQLiteStateStore, db_path: Path) -> None:
    fill(control)
    with sqlite3.connect(db_path) as db:
        _swap(db)
    with store.reading() as conn:
        names = {(b.name, b.seq) for b in verify_chain(conn).breaks}
    assert {("reordered", 2), ("reordered", 4)} <= names


def test_receipts_json_lines(control: Control, db_path: Path, tmp_path: Path) -> None:
    fill(control)
    ran = run_cli(["receipts", "--json", "--store-url", f"sqlite:///{db_path}"], tmp_path)
    assert ran.code == 0
    lines = [json.loads(line) for line in ran.out.splitlines()]
    assert [x["kind"] for x in lines] == ["receipt"] * 5
    assert all(x["hash"].startswith("sha256:") for x in lines)
    last = run_cli(["receipts", "--last", "2", "--store-url", f"sqlite:///{db_path}"], tmp_path)
    assert len(last.out.splitlines()) == 2
    assert "allow/committed  refund:p2  bot" in last.out.splitlines()[-1]
