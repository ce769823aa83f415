"""The indexed addon manager calls exactly what mitmproxy's own would, in the same order."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import pytest
from mitmproxy import exceptions, hooks, options
from mitmproxy.addonmanager import AddonManager
from mitmproxy.master import Master
from mitmproxy.proxy import server_hooks
from mitmproxy.test import tflow

from ctrlrun.proxy.dispatch import IndexedAddons, IndexedMaster

Calls = list[tuple[str, str]]


class Recorder:
    def __init__(self, name: str, calls: Calls) -> None:
        self.name, self.calls = name, calls

    def request(self, flow: Any) -> None:
        self.calls.append((self.name, "request"))

    async def response(self, flow: Any) -> None:
        await asyncio.sleep(0)
        self.calls.append((self.name, "response"))


class Updates(Recorder):
    def update(self, flows: Any) -> None:
        self.calls.append((self.name, f"update {len(flows)}"))


class Failing(Recorder):
    def request(self, flow: Any) -> None:
        self.calls.append((self.name, "request fails"))
        raise ValueError("boom")


class Halting(Recorder):
    def response(self, flow: Any) -> None:  # type: ignore[override]
        self.calls.append((self.name, "response halts"))
        raise exceptions.AddonHalt


class Parent(Recorder):
    def __init__(self, name: str, calls: Calls) -> None:
        super().__init__(name, calls)
        self.addons = [Recorder(f"{name}.child", calls), Updates(f"{name}.updates", calls)]


class Odd:
    """Attributes named like hooks that are not hooks."""

    name = "odd"
    request = os  # a module: no hook, silently
    response = 42  # not callable: an error logged on every event, as mitmproxy does

    def __str__(self) -> str:
        return "odd"


def chain(calls: Calls) -> list[Any]:
    return [
        Recorder("a", calls),
        Failing("b", calls),
        Parent("c", calls),
        Odd(),
        Updates("d", calls),
        Halting("e", calls),
        Recorder("f", calls),
    ]


async def drive(make: Any, caplog: pytest.LogCaptureFixture) -> tuple[Calls, list[str]]:
    calls: Calls = []
    master = make(options.Options())
    master.addons.add(*chain(calls))
    flow = tflow.tflow(resp=True)
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        for _ in range(2):  # the second time from the index
            await master.addons.handle_lifecycle(hooks.UpdateHook([flow]))
            await master.addons.handle_lifecycle(server_hooks.ClientConnectedHook(flow.client_conn))
            from mitmproxy.proxy.layers.http import HttpRequestHook, HttpResponseHook

            await master.addons.handle_lifecycle(HttpRequestHook(flow))
            await master.addons.handle_lifecycle(HttpResponseHook(flow))
            await master.addons.trigger_event(hooks.UpdateHook([flow, flow]))
        # The chain changes: the index follows.
        calls.append(("-", "chain changed"))
        master.addons.remove(master.addons.get("a"))
        master.addons.add(Recorder("g", calls))
        await master.addons.handle_lifecycle(HttpRequestHook(flow))
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    await master.done()
    return calls, errors


def test_events_reach_the_same_hooks_in_the_same_order_as_mitmproxys_manager(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def theirs(opts: Any) -> Master:
        return Master(opts, with_termlog=False)

    expected = asyncio.run(drive(theirs, caplog))
    got = asyncio.run(drive(IndexedMaster, caplog))
    assert got == expected
    calls, errors = got
    assert ("b", "request fails") in calls and ("c", "request") in calls  # an error: next runs
    assert ("e", "response halts") in calls and ("f", "response") not in calls  # halted
    assert ("c.updates", "update 1") in calls and ("d", "update 2") in calls
    after = calls[calls.index(("-", "chain changed")) :]
    assert ("g", "request") in after and ("a", "request") not in after
    assert any("boom" in e for e in errors) and any("not callable" in e for e in errors)


def test_the_sidecars_master_uses_the_indexed_manager() -> None:
    async def make() -> Any:
        master = IndexedMaster(options.Options())
        await master.done()
        return master

    master = asyncio.run(make())
    assert type(master.addons) is IndexedAddons
    assert isinstance(master.addons, AddonManager)
    assert master.addons.callables("update") == ()
