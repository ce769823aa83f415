"""The gauge of effects left ambiguous for over an hour (read at scrape time, by index)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import insert

from ctrlrun import SQLiteStateStore
from ctrlrun.action import iso, utc_now
from ctrlrun.proxy.metrics import Metrics
from ctrlrun.schema import effects

GAUGE = "ctrlrun_ambiguous_effects_older_than_1h"


def scrape(metrics: Metrics, store: SQLiteStateStore) -> dict[str, float]:
    text = metrics.render(store).decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_ambiguous_effects_older_than_an_hour_are_counted(tmp_path: Path) -> None:
    store = SQLiteStateStore(tmp_path / "state.db")
    now = utc_now()
    ages = {"a": (30, "ambiguous"), "b": (61, "ambiguous"), "c": (600, "ambiguous")}
    ages |= {"d": (600, "committed"), "e": (600, "failed")}
    rows = [
        {
            "effect_key": key,
            "state": state,
            "action_id": f"act_{key}",
            "attempt": 1,
            "created_at": iso(now - timedelta(minutes=minutes)),
            "updated_at": iso(now - timedelta(minutes=minutes)),
        }
        for key, (minutes, state) in ages.items()
    ]
    with store.transaction() as conn:
        conn.execute(insert(effects), rows)
    metrics = Metrics()
    try:
        samples = scrape(metrics, store)
        assert samples[GAUGE] == 2  # b and c; a is recent, d and e are settled
        assert samples["ctrlrun_ambiguous_effects_open"] == 3
    finally:
        store.close()
