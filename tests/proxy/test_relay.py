"""Stream writes relayed by mitmproxy: how the remote's answer settles the record, once, and
what the agent is told when the ledger cannot record it."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest

from ctrlrun.action import Principal
from ctrlrun.control import Control
from ctrlrun.proxy import relay
from ctrlrun.proxy.classify import Transport
from ctrlrun.proxy.config_parse import policy_from_yaml, proxy_config
from ctrlrun.proxy.prepare import Prepared, prepare
from ctrlrun.proxy.refusals import Refusal
from ctrlrun.proxy.routes import Mapped, Request, map_request
from ctrlrun.store import SQLiteStateStore

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  k8s.exec: {decision: allow}
upstreams:
  cluster: {profile: kubernetes, url: "http://127.0.0.1:1", cluster: prod-eu}
"""
EXEC = Request(
    "GET",
    "/api/v1/namespaces/default/pods/web-0/exec",
    {"command": ["ls"]},
    {"upgrade": "websocket"},
)


def relayed(tmp_path: Path) -> relay.Relayed:
    policy = policy_from_yaml(POLICY)
    [up] = proxy_config(policy).upstreams
    ctl = Control(policy, SQLiteStateStore(tmp_path / "state.db"))
    mapped = map_request(up, EXEC)
    assert isinstance(mapped, Mapped)
    p = prepare(up, EXEC, mapped, Principal("agent"), ctl.policy, ctl.environment)
    assert isinstance(p, Prepared) and relay.is_relayed(p)
    attempt = ctl.begin(p.action, p.effect_key, lease=timedelta(seconds=60), upstream=up.name)
    return relay.Relayed(ctl, up, p, attempt)


@pytest.mark.parametrize(
    ("status", "transport", "outcome"),
    [
        (101, None, "committed"),  # switched protocols: the command runs
        (200, None, "committed"),
        (400, None, "failed"),  # "Upgrade request required": nothing ran
        (403, None, "failed"),
        (404, None, "failed"),
        (302, None, "ambiguous"),
        (500, None, "ambiguous"),
        (None, Transport.NOT_SENT, "failed"),
        (None, Transport.SENT_NO_STATUS, "ambiguous"),
    ],
)
def test_the_remotes_answer_settles_the_record(
    tmp_path: Path, status: int | None, transport: Transport | None, outcome: str
) -> None:
    pending = relayed(tmp_path)
    try:
        got = asyncio.run(relay.settle(pending, status, transport, None))
        assert isinstance(got, tuple)
        assert got[0] == outcome and got[1] is not None and got[1].startswith("ctr_")
        with pytest.raises(RuntimeError):
            asyncio.run(relay.settle(pending, status, transport, None))  # once, never twice
    finally:
        pending.control.store.close()


def test_a_ledger_that_cannot_record_the_answer_is_a_refusal(tmp_path: Path) -> None:
    pending = relayed(tmp_path)
    (tmp_path / "state.db").unlink()
    pending.control.store.close()

    got = asyncio.run(relay.settle(pending, 101, None, None))

    assert isinstance(got, Refusal)
    assert (got.outcome, got.reason, got.action) == (
        "upstream_ambiguous",
        "outcome_not_recorded",
        "k8s.exec",
    )
