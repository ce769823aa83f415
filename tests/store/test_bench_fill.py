"""The ledger benchmark's fill (``tests/bench/_ledger_fill.py``) writes what the kernel would:
a row for every column, a chain ``verify_chain`` accepts, the ambiguous effects the sweep and
``effects --state`` read. A column added to a table fails it by name, not in mid-benchmark."""

from __future__ import annotations

import sys
from pathlib import Path

from sqlalchemy import text

from ctrlrun import ledger
from ctrlrun.receipts import verify_chain
from ctrlrun.states import EffectState
from ctrlrun.store import SQLiteStateStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import _ledger_fill


def test_a_filled_ledger_is_one_the_kernel_reads(tmp_path: Path) -> None:
    report = _ledger_fill.fill_sqlite(tmp_path / "l.db", 2000, max_seconds=60)
    assert (report.effects, report.receipts, report.ambiguous) == (2000, 2000, 2)
    store = SQLiteStateStore(tmp_path / "l.db", create=False)
    try:
        with store.reading() as conn:
            assert verify_chain(conn).ok
            ambiguous = ledger.list_effects(conn, EffectState.AMBIGUOUS)
            assert len(ambiguous) == 2
            asked = conn.execute(
                text(
                    "SELECT checks, check_answer, check_attempt FROM effects "
                    "WHERE state = 'ambiguous'"
                )
            ).all()
            assert set(asked) == {(1, "unknown", 1)}
    finally:
        store.close()
