"""The ``ctrlrun`` command: help everywhere, read commands that never create, clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from sdk_support import invoke, run_cli

from ctrlrun import (
    ActionDenied,
    ApprovalRequired,
    Control,
    NotExecuted,
    Policy,
    SQLiteStateStore,
    context,
    protect,
)
from ctrlrun.cli import main

KERNEL_COMMANDS = [
    "approvals",
    "approve",
    "deny",
    "effects",
    "init",
    "inspect",
    "receipts",
    "resolve",
    "stats",
]


def all_commands(group: click.Group = main, prefix: tuple[str, ...] = ()) -> list[list[str]]:
    found: list[list[str]] = [list(prefix)]
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            found += all_commands(command, (*prefix, name))
        else:
            found.append([*prefix, name])
    return found


COMMANDS = all_commands()


@pytest.fixture
def filled(control: Control, tmp_path: Path) -> dict[str, Any]:
    """A ledger beside ./ctrlrun.yaml with one effect in each state and a pending approval."""
    found: dict[str, Any] = {}

    @protect("refund", control=control)
    def refund(payment_id: str, amount: int) -> None:
        if payment_id == "lost":
            raise TimeoutError("no reply from the bank")
        if payment_id == "declined":
            raise NotExecuted("card declined")

    @protect("delete", control=control)
    def delete(name: str) -> None: ...

    with context("bot", "alice"):
        refund("ok", 100)
        with pytest.raises(TimeoutError):
            refund("lost", 200)
        with pytest.raises(NotExecuted):
            refund("declined", 300)
        with pytest.raises(ActionDenied):
            delete("prod")
        with pytest.raises(ApprovalRequired) as info:
            refund("big", 250_000)
    found["request_id"] = info.value.request_id
    found["action_id"] = info.value.action_id
    return found


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) or "main" for c in COMMANDS])
def test_help_exits_zero(command: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    if command and command[0] in KERNEL_COMMANDS:
        assert "Example" in result.output


@pytest.mark.parametrize(
    ("command", "teaches"),
    [
        (["approve"], ["approvals_required", "different operators", "--as alice"]),
        (["deny"], ["One deny denies"]),
        (["console"], ["--public-url", "operators:", "--max-connections"]),
        (["budgets"], ["past the limit"]),
        (["resolve"], ["--note"]),
    ],
)
def test_help_of_what_changed_teaches_it(command: list[str], teaches: list[str]) -> None:
    shown = " ".join(CliRunner().invoke(main, [*command, "--help"]).output.split())
    for part in teaches:
        assert part in shown, shown


def test_kernel_commands_exist() -> None:
    assert set(KERNEL_COMMANDS) <= set(main.commands)


READ_COMMANDS = [
    ["receipts"],
    ["receipts", "--verify-chain"],
    ["effects"],
    ["inspect", "act_" + "0" * 32],
    ["approvals"],
    ["stats"],
    ["resolve", "refund:x", "--failed"],
    ["approve", "apr_" + "0" * 32],
    ["deny", "apr_" + "0" * 32],
]


@pytest.mark.parametrize("args", READ_COMMANDS, ids=[" ".join(a[:2]) for a in READ_COMMANDS])
def test_empty_directory_says_where_it_looked(tmp_path: Path, args: list[str]) -> None:
    # One of them through the real console entry (a subprocess), the rest in-process.
    ran = (run_cli if args == ["receipts"] else invoke)(args, tmp_path)
    assert ran.code == 1
    assert ran.out == ""
    assert str(tmp_path / ".ctrlrun" / "state.db") in ran.err
    assert len(ran.err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # no store, no directory


def test_receipts_lists_in_order(filled: dict[str, Any], tmp_path: Path) -> None:
    ran = invoke(["receipts"], tmp_path)
    assert ran.code == 0, ran.err
    lines = ran.out.splitlines()
    assert [line.split("  ")[3] for line in lines] == [
        "allow/committed",
        "allow/ambiguous",
        "allow/failed",
        "deny/denied",
    ]
    assert lines[1].split("  ")[4:] == ["refund:lost", "bot"]


def test_effects_by_state(filled: dict[str, Any], tmp_path: Path) -> None:
    ran = invoke(["effects", "--state", "ambiguous"], tmp_path)
    assert ran.code == 0
    (line,) = ran.out.splitlines()
    assert line.startswith("refund:lost  ambiguous  attempt 1  act_")
    assert invoke(["effects", "--state", "reserved"], tmp_path).out == "no effects are reserved\n"
    everything = invoke(["effects"], tmp_path).out.splitlines()
    assert sorted(line.split("  ")[1] for line in everything) == [
        "ambiguous",
        "committed",
        "failed",
    ]
    bad = invoke(["effects", "--state", "bogus"], tmp_path)
    assert bad.code == 2


def test_inspect(filled: dict[str, Any], store: SQLiteStateStore, tmp_path: Path) -> None:
    with store.reading() as conn:
        action_id = conn.exec_driver_sql(
            "SELECT action_id FROM receipts WHERE effect_key = 'refund:lost'"
        ).scalar()
    ran = invoke(["inspect", action_id], tmp_path)
    assert ran.code == 0, ran.err
    assert f"action     refund  ({action_id})" in ran.out
    assert "principal  bot for alice" in ran.out
    assert 'arguments  {"amount": 200, "payment_id": "lost"}' in ran.out
    assert "TimeoutError: no reply from the bank" in ran.out
    assert "record     refund:lost  ambiguous  attempt 1" in ran.out
    assert "EXECUTION_AMBIGUOUS" in ran.out

    doc = json.loads(invoke(["inspect", action_id, "--json"], tmp_path).out)
    assert doc["action_id"] == action_id
    assert doc["receipt"]["result"] == "ambiguous"
    assert doc["effect"]["state"] == "ambiguous"
    assert [e["type"] for e in doc["events"]][:2] == ["ACTION_PROPOSED", "POLICY_EVALUATED"]

    pending = invoke(["inspect", filled["action_id"]], tmp_path)
    assert "awaiting a human" in pending.out
    assert f"approval   {filled['request_id']}  pending" in pending.out

    unknown = invoke(["inspect", "act_" + "f" * 32], tmp_path)
    assert unknown.code == 1 and unknown.out == "" and "no action" in unknown.err


def test_approvals_lists_pending(filled: dict[str, Any], tmp_path: Path) -> None:
    ran = invoke(["approvals"], tmp_path)
    (line,) = ran.out.splitlines()
    assert line.startswith(f"{filled['request_id']}  refund  ")
    assert '{"amount": 250000, "payment_id": "big"}' in line and "agent bot" in line
    (doc,) = [json.loads(x) for x in invoke(["approvals", "--json"], tmp_path).out.splitlines()]
    assert doc["request_id"] == filled["request_id"]
    assert doc["action"]["arguments"] == {"amount": 250000, "payment_id": "big"}
    assert doc["expired"] is False and "expired" not in line
    invoke(["deny", filled["request_id"]], tmp_path)
    assert invoke(["approvals"], tmp_path).out == "no pending approvals\n"


def test_approvals_says_a_request_past_its_expiry_is_expired(
    filled: dict[str, Any], store: SQLiteStateStore, tmp_path: Path
) -> None:
    # No sidecar has marked it yet: the row still says pending, but it cannot be granted.
    with store.transaction() as conn:
        conn.exec_driver_sql(
            "UPDATE approvals SET expires_at = '2000-01-01T00:00:00.000000Z' WHERE approval_id = ?",
            (filled["request_id"],),
        )
    (line,) = invoke(["approvals"], tmp_path).out.splitlines()
    assert (
        line.startswith(filled["request_id"]) and "(expired: it can no longer be granted)" in line
    )
    (doc,) = [json.loads(x) for x in invoke(["approvals", "--json"], tmp_path).out.splitlines()]
    assert doc["expired"] is True


def test_stats(filled: dict[str, Any], tmp_path: Path) -> None:
    ran = invoke(["stats"], tmp_path)
    assert ran.code == 0 and ran.out.startswith("receipts  4\n")
    doc = json.loads(invoke(["stats", "--json"], tmp_path).out)
    assert doc["by_result"] == {"ambiguous": 1, "committed": 1, "denied": 1, "failed": 1}
    assert doc["by_action"] == {"delete": 1, "refund": 3}
    assert doc["effects"] == {"ambiguous": 1, "committed": 1, "failed": 1}


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["resolve", "refund:ok", "--failed"], 1, "is not ambiguous"),
        (["resolve", "refund:declined", "--committed"], 1, "is not ambiguous"),
        (["resolve", "refund:nobody", "--failed"], 1, "nobody reserved"),
        (["resolve", "refund:lost"], 2, "--committed or --failed"),
        (["resolve", "refund:lost", "--committed", "--failed"], 2, "exactly one"),
        (["approve", "apr_" + "0" * 32], 1, "no approval request"),
        (["receipts", "--last", "0"], 2, "--last"),
        (["receipts", "--store-url", "mysql://u@h/db"], 2, "unsupported store URL"),
        (["nonsense"], 2, "No such command"),
    ],
    ids=[
        "committed",
        "failed",
        "unknown",
        "no_flag",
        "both_flags",
        "approve_unknown",
        "last_0",
        "bad_url",
        "bad_command",
    ],
)
def test_expected_errors(
    filled: dict[str, Any], tmp_path: Path, args: list[str], code: int, fragment: str
) -> None:
    ran = (run_cli if args[0] == "resolve" else invoke)(args, tmp_path)
    assert ran.code == code, ran.err
    assert fragment in ran.err
    assert ran.out == ""


def test_resolve_committed(filled: dict[str, Any], tmp_path: Path) -> None:
    ran = invoke(["resolve", "refund:lost", "--committed", "--as", "alice"], tmp_path)
    assert ran.code == 0 and ran.out == "refund:lost resolved committed by alice\n"
    timeline = invoke(["receipts"], tmp_path).out
    assert "EFFECT_RESOLVED  refund:lost  committed by alice" in timeline


def test_resolve_records_the_os_user_without_as(filled: dict[str, Any], tmp_path: Path) -> None:
    import getpass

    ran = invoke(["resolve", "refund:lost", "--committed"], tmp_path)
    assert ran.code == 0 and ran.out == f"refund:lost resolved committed by {getpass.getuser()}\n"


def test_store_from_environment(filled: dict[str, Any], db_path: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for env in (
        {"CTRLRUN_STATE": str(db_path)},
        {"CTRLRUN_STORE_URL": f"sqlite:///{db_path}"},
        {"CTRLRUN_CONFIG": str(tmp_path / "ctrlrun.yaml")},
    ):
        ran = invoke(["stats", "--json"], elsewhere, env=env)
        assert ran.code == 0, (env, ran.err)
        assert json.loads(ran.out)["receipts"] == 4
    assert list(elsewhere.iterdir()) == []


def test_init_writes_a_loadable_policy(tmp_path: Path) -> None:
    ran = invoke(["init"], tmp_path)
    assert ran.code == 0 and ran.out == "wrote ctrlrun.yaml\ncreated .ctrlrun/\n"
    Policy.from_file(tmp_path / "ctrlrun.yaml")
    again = invoke(["init"], tmp_path)
    assert again.code == 1 and "already exists" in again.err


def test_json_output_is_json_lines_only(store: SQLiteStateStore, tmp_path: Path) -> None:
    """An empty ledger prints nothing under --json; people still get a sentence without it."""
    for command, sentence in [
        (["effects"], "no effects yet\n"),
        (["effects", "--state", "ambiguous"], "no effects are ambiguous\n"),
        (["receipts"], "no receipts yet\n"),
        (["approvals"], "no pending approvals\n"),
    ]:
        quiet = invoke([*command, "--json"], tmp_path)
        assert (quiet.code, quiet.out, quiet.err) == (0, "", ""), command
        assert invoke(command, tmp_path).out == sentence


def test_json_lines_parse_one_by_one(filled: dict[str, Any], tmp_path: Path) -> None:
    for command in (["effects"], ["receipts"], ["approvals"]):
        lines = invoke([*command, "--json"], tmp_path).out.splitlines()
        assert lines and all(isinstance(json.loads(line), dict) for line in lines), command


@pytest.fixture
def many(control: Control, clock: Any) -> int:
    """105 committed effects, one second apart, refund:p0 the oldest."""

    @protect("refund", control=control)
    def refund(payment_id: str, amount: int) -> None: ...

    with context("bot"):
        for i in range(105):
            refund(f"p{i}", 1)
            clock.advance(seconds=1)
    return 105


def test_effects_shows_the_newest_100_by_default(many: int, tmp_path: Path) -> None:
    ran = invoke(["effects"], tmp_path)
    keys = [line.split("  ")[0] for line in ran.out.splitlines()]
    assert keys == [f"refund:p{i}" for i in range(104, 4, -1)]
    assert "newest 100" in ran.err and "--all" in ran.err
    as_json = invoke(["effects", "--json"], tmp_path)
    assert len(as_json.out.splitlines()) == 100 and "--all" in as_json.err


@pytest.mark.parametrize(
    ("flags", "shown", "cut"),
    [(["--limit", "3"], 3, True), (["--limit", "105"], 105, False), (["--all"], 105, False)],
)
def test_effects_limit_and_all(
    many: int, tmp_path: Path, flags: list[str], shown: int, cut: bool
) -> None:
    ran = invoke(["effects", *flags], tmp_path)
    assert ran.code == 0
    keys = [line.split("  ")[0] for line in ran.out.splitlines()]
    assert keys == [f"refund:p{i}" for i in range(104, 104 - shown, -1)]
    assert ("--all" in ran.err) is cut


@pytest.mark.parametrize("flags", [["--limit", "0"], ["--limit", "x"], ["--limit", "2", "--all"]])
def test_effects_bad_limits_are_usage_errors(
    store: SQLiteStateStore, tmp_path: Path, flags: list[str]
) -> None:
    ran = invoke(["effects", *flags], tmp_path)
    assert ran.code == 2 and ran.out == ""
    assert "--limit" in ran.err


def test_the_console_entry_point_is_the_cli_main() -> None:
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="ctrlrun")
    assert script.value == "ctrlrun.cli:main"
    assert script.load() is main


def test_resolve_keeps_the_operators_note_and_receipts_show_it(tmp_path: Path) -> None:
    from sdk_support import POLICY, events

    from ctrlrun import Action, Principal

    db = tmp_path / "state.db"
    store = SQLiteStateStore(db)
    control = Control(Policy.from_yaml(POLICY), store)
    refund = Action("refund", {"payment_id": "p1", "amount": 100}, Principal("bot"))
    attempt = control.begin(refund, "refund:p1")
    control.finish(attempt, "ambiguous", error="reply lost")
    url = f"sqlite:///{db}"
    empty = run_cli(
        ["resolve", "refund:p1", "--failed", "--note", " ", "--store-url", url], tmp_path
    )
    assert empty.code == 2 and "--note is empty" in empty.err
    args = ["resolve", "refund:p1", "--failed", "--note", "no re_ at Stripe", "--as", "alice"]
    ran = run_cli([*args, "--store-url", url], tmp_path)
    assert ran.code == 0, ran.err
    resolved = [d for t, d in events(store, "refund:p1") if t == "EFFECT_RESOLVED"]
    assert resolved[-1]["note"] == "no re_ at Stripe"
    shown = run_cli(["receipts", "--store-url", url], tmp_path)
    assert '"no re_ at Stripe"' in shown.out, shown.out
    store.close()


def test_freeze_of_a_name_the_policy_lacks_says_it_may_be_a_typo(tmp_path: Path) -> None:
    (tmp_path / "ctrlrun.yaml").write_text(
        "schema: ctrlrun.policy/v2\nactions:\n  stripe.refund: {decision: allow}\n",
        encoding="utf-8",
    )
    SQLiteStateStore(tmp_path / ".ctrlrun" / "state.db").close()
    base = ["freeze", "--reason", "loop", "--as", "alice"]
    typo = run_cli([*base, "--action", "stripe.refnud"], tmp_path)
    assert typo.code == 0 and typo.out.startswith("frozen: stripe.refnud is frozen by alice")
    assert "if that is a typo, nothing is frozen" in typo.err
    assert "ctrlrun unfreeze --action stripe.refnud" in typo.err
    for right in (["--action", "stripe.refund"], []):
        ran = run_cli([*base, *right], tmp_path)
        assert ran.code == 0 and ran.err == "", ran.err
