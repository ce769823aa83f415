"""The sidecar's rounds of expiring approval requests say a ledger outage once, not per round."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

import ctrlrun.proxy.server as server
from ctrlrun.store import SQLiteStateStore


def test_a_lost_ledger_is_one_warning_however_many_rounds_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = SQLiteStateStore(tmp_path / "state.db")
    (tmp_path / "state.db").unlink()  # every transaction is refused from now on
    monkeypatch.setattr(server, "EXPIRE_INTERVAL", 0.01)

    async def rounds() -> None:
        task = asyncio.create_task(server._expire_forever(SimpleNamespace(store=store)))  # type: ignore[arg-type]
        await asyncio.sleep(0.3)  # some thirty rounds
        task.cancel()

    with caplog.at_level(logging.WARNING, logger="ctrlrun.proxy.server"):
        asyncio.run(rounds())
    said = [r for r in caplog.records if "expiring approval requests failed" in r.message]
    assert len(said) == 1
    store.close()
