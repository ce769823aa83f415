"""What ``ctrlrun effects`` and ``ctrlrun inspect`` can show of an ambiguous effect's checks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sweep_support import POLICY, Clock, Remote, stuck

from ctrlrun import Control, Policy, SQLiteStateStore, checks, ledger, views
from ctrlrun.action import iso
from ctrlrun.checks import Backoff
from ctrlrun.reconcilers.sweep import sweep
from ctrlrun.states import EffectState


@pytest.fixture
def control(tmp_path: Path) -> Iterator[Control]:
    store = SQLiteStateStore(tmp_path / "state.db")
    ctl = Control(Policy.from_yaml(POLICY), store, clock=Clock())
    ctl.reconciler.backoff = Backoff(jitter=0.0)
    yield ctl
    store.close()


def test_an_ambiguous_effect_shows_its_checks_and_when_the_next_is_due(control: Control) -> None:
    clock = control.clock
    asked, fresh = stuck(control.store, 2, clock())
    sweep(control, {"kube": Remote()}, keys=[asked])
    sweep(control, {"kube": Remote()}, keys=[asked])
    due = iso(clock() + timedelta(seconds=60))
    with control.store.reading() as conn:
        records = {r.effect_key: r for r in ledger.list_effects(conn, EffectState.AMBIGUOUS)}
        found = checks.schedules(conn, list(records))
        inspected = views.inspection(conn, records[asked].action_id)
    assert views.effect_line(records[asked], clock(), found[asked]).endswith(
        f"  asked 2 times, next check {due}"
    )
    assert views.effect_line(records[fresh], clock(), found[fresh]).endswith(
        "  asked 0 times, next check now"
    )
    shown = views.effect_json(records[asked], found[asked])
    assert (shown["checks"], shown["next_check_at"]) == (2, due)
    assert "checks" not in views.effect_json(records[asked])  # as before, without a schedule
    assert inspected is not None
    assert {k: inspected["effect"][k] for k in checks.SCHEDULE_COLUMNS} == {
        "next_check_at": due,
        "checks": 2,
        "check_answer": "unknown",
        "check_attempt": 1,
    }


def test_a_settled_effect_shows_no_schedule(control: Control) -> None:
    (key,) = stuck(control.store, 1, control.clock())
    sweep(control, {"kube": Remote("committed")})
    with control.store.reading() as conn:
        (rec,) = ledger.list_effects(conn)
        found = checks.schedules(conn, [key])
    assert "next check" not in views.effect_line(rec, control.clock(), found[key])
    assert "checks" not in views.effect_json(rec, found[key])


def test_the_cli_shows_when_an_ambiguous_effect_is_asked_next(control: Control) -> None:
    from click.testing import CliRunner

    from ctrlrun.cli import main as cli_main

    clock = control.clock
    asked, _fresh = stuck(control.store, 2, clock())
    sweep(control, {"kube": Remote()}, keys=[asked])
    url = control.store.location
    listed = CliRunner().invoke(cli_main, ["effects", "--store-url", url])
    assert listed.exit_code == 0, listed.output
    assert "asked 1 times, next check " in listed.output
    assert "asked 0 times, next check now" in listed.output
    shown = CliRunner().invoke(cli_main, ["effects", "--json", "--store-url", url])
    rows = {row["effect_key"]: row for row in map(json.loads, shown.output.splitlines())}
    assert rows[asked]["checks"] == 1
    with control.store.reading() as conn:
        (rec,) = [r for r in ledger.list_effects(conn) if r.effect_key == asked]
    inspected = CliRunner().invoke(cli_main, ["inspect", rec.action_id, "--store-url", url])
    assert "checks     asked 1 times, last answer unknown, next check " in inspected.output
