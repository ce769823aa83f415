"""MCP tool calls whose arguments a FastMCP (pydantic, lax mode) server reads as another value
than ctrlrun does, through the sidecar against a real FastMCP server.

The server's tools (``refund_order(order_id: int, amount: int)``, ``refund_in_full(order_id:
int, full: bool)``) count what they run; the effect key is made of ``order_id`` (and ``full``).
Every spelling pydantic coerces to the value already refunded must be the same key (a
duplicate) or refused: the server runs the refund once.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Sidecar, running_sidecar
from test_mcp_wire import Raw, call

from ctrlrun.testing import FakeKubernetes, FakeStripe
from ctrlrun.testing.stripe_mcp import FakeStripeMcp

pytestmark = pytest.mark.timeout(120)
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  orders.refund:
    effect: "refund:{{{{order_id}}}}"
    decision: allow
upstreams:
  orders:
    profile: mcp
    url: {url}
    tools:
      refund_order:
        action: orders.refund
        arguments: [order_id, amount]
      refund_in_full:
        action: orders.refund
        arguments: [order_id, full]
        effect: "full:{{{{order_id}}}}:{{{{full}}}}"
      refund_slowly:
        action: orders.refund
        arguments: [order_id, amount]
"""


class Orders:
    """A FastMCP server whose tools run as pydantic reads their arguments."""

    def __init__(self, stripe: FakeStripe) -> None:
        self.server = FakeStripeMcp(stripe, json_response=True)
        self.refunds: list[tuple[int, int]] = []
        self.started, self.release = threading.Event(), threading.Event()

        @self.server.mcp.tool()
        def refund_order(order_id: int, amount: int) -> str:
            """Refund an order."""
            self.refunds.append((order_id, amount))
            return json.dumps({"refunded": order_id})

        @self.server.mcp.tool()
        def refund_in_full(order_id: int, full: bool) -> str:
            """Refund an order, in full or not."""
            self.refunds.append((order_id, int(full)))
            return json.dumps({"refunded": order_id, "full": full})

        @self.server.mcp.tool()
        async def refund_slowly(order_id: int, amount: int) -> str:
            """Refund an order once the test releases it."""
            self.started.set()
            for _ in range(400):  # bounded: at most 20 s
                if self.release.is_set():
                    break
                await asyncio.sleep(0.05)
            self.refunds.append((order_id, amount))
            return json.dumps({"refunded": order_id})


@pytest.fixture
def orders(fakes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[Orders]:
    made = Orders(fakes[0])
    with made.server:
        yield made


@pytest.fixture
def sc(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes], orders: Orders
) -> Iterator[Sidecar]:
    text = POLICY.format(url=orders.server.url)
    with running_sidecar(tmp_path, *fakes, policy_text=text, in_process=True) as sidecar:
        yield sidecar


@pytest.fixture
def raw(sc: Sidecar, orders: Orders) -> Raw:
    session = Raw(orders.server.url, sc.proxy_url)
    session.open()
    return session


def _result(raw: Raw, rid: int, name: str, **arguments: Any) -> dict[str, Any]:
    got = raw.post(json.dumps(call(rid, name, **arguments)).encode())
    assert got.status_code == 200, got.text
    result: dict[str, Any] = got.json()["result"]
    return result


def _outcome(result: dict[str, Any]) -> str | None:
    meta: dict[str, Any] = result.get("_meta", {}).get("com.ctrlrun/receipt", {})
    return meta.get("outcome")


@pytest.mark.parametrize("spelling", ["042", "42.0", "+42", " 42", "42 ", "4_2", 42.0, True])
def test_an_integer_argument_spelt_otherwise_is_not_a_second_refund(
    raw: Raw, orders: Orders, spelling: Any
) -> None:
    first = _result(raw, 1, "refund_order", order_id=42, amount=500)
    assert not first.get("isError"), first
    assert orders.refunds == [(42, 500)]
    again = _result(raw, 2, "refund_order", order_id=spelling, amount=500)
    assert again.get("isError"), again
    assert _outcome(again) in ("duplicate", "invalid_request"), again
    assert orders.refunds == [(42, 500)]  # the server ran the refund once


def test_the_plain_string_of_the_integer_is_the_same_effect(raw: Raw, orders: Orders) -> None:
    assert not _result(raw, 1, "refund_order", order_id="42", amount=500).get("isError")
    again = _result(raw, 2, "refund_order", order_id=42, amount=500)
    assert _outcome(again) == "duplicate", again
    other = _result(raw, 3, "refund_order", order_id=43, amount=500)
    assert not other.get("isError"), other
    assert orders.refunds == [(42, 500), (43, 500)]


@pytest.mark.parametrize("spelling", ["yes", "true", "TRUE", "on", "t", "y", True, "1"])
def test_a_boolean_argument_spelt_otherwise_is_not_a_second_refund(
    raw: Raw, orders: Orders, spelling: Any
) -> None:
    first = _result(raw, 1, "refund_in_full", order_id=7, full=1)
    assert not first.get("isError"), first
    again = _result(raw, 2, "refund_in_full", order_id=7, full=spelling)
    assert _outcome(again) in ("duplicate", "invalid_request"), again
    assert orders.refunds == [(7, 1)]


def test_a_body_declared_us_ascii_must_be_ascii(raw: Raw, orders: Orders) -> None:
    # A server that decodes in the declared charset reads "é" and "ü" alike (U+FFFD, "?" or
    # the byte with its high bit cleared): two values here, one there.
    before = len(orders.server.requests)
    declared = "application/json; charset=us-ascii"
    for order in ("café", "cafü"):
        message = call(1, "refund_order", order_id=order, amount=500)
        body = json.dumps(message, ensure_ascii=False).encode()
        got = raw.post(body, **{"Content-Type": declared})
        assert got.status_code == 400, got.text
        assert got.headers.get("x-ctrlrun-outcome") == "invalid_request", got.text
        assert "us-ascii" in got.text
    assert len(orders.server.requests) == before  # nothing forwarded
    plain = json.dumps(call(2, "refund_order", order_id=42, amount=500)).encode()
    done = raw.post(plain, **{"Content-Type": declared})
    assert done.status_code == 200 and not done.json()["result"]["isError"], done.text
    assert orders.refunds == [(42, 500)]


@pytest.mark.parametrize(
    "other",
    [
        {"jsonrpc": "2.0", "id": 5, "method": "ping"},
        {"jsonrpc": "2.0", "id": "5", "method": "tools/list"},
        call(5, "refund_order", order_id=8, amount=100),
    ],
)
def test_a_request_with_the_id_of_a_call_in_flight_takes_none_of_its_answer(
    raw: Raw, orders: Orders, other: dict[str, Any]
) -> None:
    # The mcp SDK's transport routes answers by id: were the call forwarded with id 5, the
    # newer request would take the call's answer (or give it its own). ctrlrun forwards it
    # with an id of its own (mcp_ids): each gets its own answer, and the call's record is its.
    answers: list[dict[str, Any]] = []
    slow = json.dumps(call(5, "refund_slowly", order_id=7, amount=100)).encode()
    thread = threading.Thread(target=lambda: answers.append(raw.post(slow).json()))
    thread.start()
    try:
        assert orders.started.wait(15)
        got = raw.post(json.dumps(other).encode())
        assert got.status_code == 200, got.text
        assert got.json()["id"] == other["id"] and "result" in got.json(), got.text
    finally:
        orders.release.set()
        thread.join(30)
    assert answers[0]["id"] == 5 and not answers[0]["result"]["isError"], answers
    assert _outcome(answers[0]) is None  # the call's own answer, as the server sent it
    assert json.loads(answers[0]["result"]["content"][0]["text"]) == {"refunded": 7}
    assert sorted(orders.refunds) == ([(7, 100), (8, 100)] if "params" in other else [(7, 100)])


@pytest.mark.parametrize("order", [9007199254740993, -9007199254740993, 2**64])
def test_an_integer_a_javascript_server_reads_as_another_is_refused(
    raw: Raw, orders: Orders, order: int
) -> None:
    # The TypeScript SDK's servers JSON.parse the body: 9007199254740993 is ...992 there, a
    # refund of the order ...992 names under another effect key.
    before = len(orders.server.requests)
    got = _result(raw, 1, "refund_order", order_id=order, amount=500)
    assert _outcome(got) == "invalid_request", got
    assert "doubles" in got["content"][0]["text"], got
    assert len(orders.server.requests) == before and orders.refunds == []
    exact = _result(raw, 2, "refund_order", order_id=2**53 - 1, amount=500)
    assert not exact.get("isError"), exact
    assert orders.refunds == [(2**53 - 1, 500)]
