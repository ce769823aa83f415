"""Receipts: one JSON document per decided action, chained by hash to the one before it."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from .action import canonical_bytes, new_id, sha256
from .errors import InvalidArgument
from .ledger import advance_chain, chain_head, store_receipt
from .schema import GENESIS_HASH, receipts

RECEIPT_SCHEMA = "ctrlrun.receipt/v3"
RESULTS = ("committed", "failed", "ambiguous", "denied", "blocked", "observed")


@dataclass(frozen=True)
class Receipt:
    """A stored receipt: its document and the hash that covers it."""

    document: Mapping[str, Any]
    hash: str

    def __getattr__(self, name: str) -> Any:
        try:
            return self.document[name]
        except KeyError:
            raise AttributeError(name) from None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.document)


def receipt_hash(document: Mapping[str, Any]) -> str:
    return sha256(canonical_bytes(document))


def write_receipt(
    conn: Connection,
    fields: Mapping[str, Any],
    *,
    event_pos: int | None = None,
    chain: tuple[int, str] | None = None,
    commit: bool = False,
) -> Receipt:
    """Append a receipt to the chain inside the caller's transaction.

    ``fields`` holds everything but ``schema``, ``receipt_id``, ``seq`` and ``prev_hash``;
    ``event_pos`` is the id of the event written just before it (looked up when not given);
    ``chain``: (seq, previous hash) when this transaction advanced the chain already.
    ``commit``: the receipt is the transaction's last write (``ledger.store_receipt``).
    """
    seq, prev = chain or advance_chain(conn)
    doc = {"schema": RECEIPT_SCHEMA, "receipt_id": new_id("ctr"), **fields}
    doc["seq"] = seq
    doc["prev_hash"] = prev
    raw = canonical_bytes(doc, checked=True)
    digest = sha256(raw)
    store_receipt(conn, doc, raw.decode("utf-8"), digest, event_pos, commit=commit)
    return Receipt(doc, digest)


def load_receipts(conn: Connection, *, last: int | None = None) -> list[Receipt]:
    """Receipts in chain order (the last ``last`` of them)."""
    stmt = select(receipts.c.json, receipts.c.hash).order_by(receipts.c.seq.desc())
    if last is not None:
        stmt = stmt.limit(last)
    rows = list(conn.execute(stmt))
    rows.reverse()
    return [Receipt(json.loads(body), digest) for body, digest in rows]


def receipt_for_action(conn: Connection, action_id: str) -> Receipt | None:
    stmt = (
        select(receipts.c.json, receipts.c.hash)
        .where(receipts.c.action_id == action_id)
        .order_by(receipts.c.seq.desc())
    )
    row = conn.execute(stmt).first()
    return None if row is None else Receipt(json.loads(row[0]), row[1])


@dataclass(frozen=True)
class ChainBreak:
    """One place where the chain does not hold."""

    name: str  # content_altered, link_broken, seq_gap, head_mismatch, unreadable
    seq: int
    detail: str


@dataclass(frozen=True)
class ChainReport:
    """What ``verify_chain`` found."""

    verified: int
    head_seq: int
    breaks: tuple[ChainBreak, ...]
    first_seq: int = 1  # where the walk began (``verify_chain``'s ``newest``)

    @property
    def ok(self) -> bool:
        return not self.breaks


def verify_chain(conn: Connection, *, newest: int | None = None) -> ChainReport:
    """Walk the receipts in ``seq`` order and name every break: altered, missing, reordered.

    ``newest``: only the last ``newest`` receipts the head counts, and their link to the one
    before them (a walk whose time does not grow with the ledger; older receipts unread).
    """
    stmt = select(receipts.c.seq, receipts.c.json, receipts.c.hash, receipts.c.prev_hash)
    breaks: list[ChainBreak] = []
    expected_seq, count = 1, 0
    prev_hash: str | None = GENESIS_HASH  # None: the receipt before the walk is missing
    if newest is not None and (first := chain_head(conn)[0] - newest + 1) > 1:
        stmt = stmt.where(receipts.c.seq >= first)
        before = conn.execute(select(receipts.c.hash).where(receipts.c.seq == first - 1))
        expected_seq, prev_hash = first, before.scalar()
        if prev_hash is None:
            breaks.append(ChainBreak("missing", first - 1, f"no receipt with seq {first - 1}"))
    start = expected_seq
    rows: Iterable[Any] = conn.execute(stmt.order_by(receipts.c.seq))
    for seq, body, digest, prev_col in rows:
        count += 1
        if seq != expected_seq:
            breaks.append(
                ChainBreak("missing", expected_seq, f"expected seq {expected_seq}, found {seq}")
            )
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            breaks.append(ChainBreak("unreadable", seq, "receipt is not a JSON object"))
            expected_seq, prev_hash = seq + 1, digest
            continue
        try:
            altered = receipt_hash(doc) != digest
        except InvalidArgument:  # a value ctrlrun never writes (a float): edited by hand
            altered = True
        if altered:
            breaks.append(ChainBreak("content_altered", seq, "content does not match its hash"))
        if doc.get("seq") != seq:
            breaks.append(ChainBreak("reordered", seq, f"document says seq {doc.get('seq')}"))
        if prev_hash is not None and (doc.get("prev_hash") != prev_hash or prev_col != prev_hash):
            breaks.append(
                ChainBreak("link_broken", seq, "prev_hash does not name the receipt before")
            )
        expected_seq, prev_hash = seq + 1, digest
    head_seq, head_hash = chain_head(conn)
    if head_seq != expected_seq - 1 or head_hash != prev_hash:
        breaks.append(
            ChainBreak(
                "head_mismatch",
                head_seq,
                f"chain head says seq {head_seq}, the last receipt is seq {expected_seq - 1}",
            )
        )
    return ChainReport(count, head_seq, tuple(breaks), start)
