"""MCP on the wire through the sidecar: batches, what passes untouched (byte for byte,
streamed), what ctrlrun cannot read, and REST and MCP sharing one effect key."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest
from harness import STRIPE_KEY, Sidecar
from stripe_support import refund, refused, stripe_client

from ctrlrun.testing import FakeKubernetes, FakeStripe
from ctrlrun.testing.stripe_mcp import FakeStripeMcp

pytestmark = pytest.mark.timeout(120)
ACCEPT = "application/json, text/event-stream"
INIT = (
    b'{ "jsonrpc": "2.0",  "id": 0, "method": "initialize", "params": {"protocolVersion":'
    b' "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}'
)


@pytest.fixture
def sc(mcp_sidecar: Sidecar) -> Sidecar:
    return mcp_sidecar  # the conftest's, in front of its mcp_server


class Raw:
    """A hand-driven MCP session: the exact bytes of every message are the test's."""

    def __init__(self, url: str, proxy: str | None) -> None:
        self.url = url
        self.http = httpx.Client(proxy=proxy, trust_env=False, timeout=30)
        self.headers = {"Authorization": f"Bearer {STRIPE_KEY}", "Accept": ACCEPT}

    def post(self, body: bytes, **headers: str) -> httpx.Response:
        hdrs = {**self.headers, "Content-Type": "application/json", **headers}
        return self.http.post(self.url, content=body, headers=hdrs)

    def open(self) -> httpx.Response:
        first = self.post(INIT)
        assert first.status_code == 200, first.text
        self.headers["Mcp-Session-Id"] = first.headers["mcp-session-id"]
        self.headers["Mcp-Protocol-Version"] = "2025-06-18"
        done = self.post(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
        assert done.status_code == 202
        return first


def call(rid: int, name: str, **arguments: Any) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


def test_a_batch_with_one_allowed_and_one_denied_call_gets_both_answers(
    sc: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], mcp_server: FakeStripeMcp
) -> None:
    stripe = fakes[0]
    pi = stripe.add_payment_intent(amount=5000)["id"]
    raw = Raw(mcp_server.url, sc.proxy_url)
    raw.open()
    batch = [
        call(1, "create_refund", payment_intent=pi, amount=300),
        call(2, "create_payout", amount=100),
        {"jsonrpc": "2.0", "id": 3, "method": "ping"},
    ]
    got = raw.post(json.dumps(batch).encode())
    assert got.status_code == 200
    answers = {a["id"]: a for a in got.json()}
    assert set(answers) == {1, 2, 3}
    assert not answers[1]["result"].get("isError"), answers[1]
    denied = answers[2]["result"]
    assert denied["isError"] is True and denied["content"][0]["text"].startswith("ctrlrun: ")
    assert denied["_meta"]["com.ctrlrun/receipt"]["outcome"] == "denied"
    assert answers[3]["result"] == {}
    assert len(stripe.refunds) == 1 and stripe.payouts == []


def test_non_tool_traffic_is_relayed_byte_for_byte(sc: Sidecar, mcp_server: FakeStripeMcp) -> None:
    direct, proxied = Raw(mcp_server.url, None), Raw(mcp_server.url, sc.proxy_url)
    assert proxied.open().content == direct.open().content
    assert mcp_server.received[-4] == mcp_server.received[-2] == INIT
    listing = b'{"jsonrpc":"2.0","id":7,"method":"tools/list" ,"params":{}}'
    one, two = direct.post(listing), proxied.post(listing)
    assert (one.status_code, one.content) == (two.status_code, two.content)
    assert mcp_server.received[-1] == listing


def test_the_get_stream_is_streamed(sc: Sidecar, mcp_server: FakeStripeMcp) -> None:
    raw = Raw(mcp_server.url, sc.proxy_url)
    raw.open()
    seen = threading.Event()
    lines: list[str] = []

    def listen() -> None:
        with raw.http.stream(
            "GET", raw.url, headers={**raw.headers, "Accept": "text/event-stream"}
        ) as got:
            assert got.status_code == 200
            for line in got.iter_lines():  # the stream never ends on its own
                lines.append(line)
                if line.startswith("data:"):
                    seen.set()
                    return

    reader = threading.Thread(target=listen, daemon=True)
    reader.start()
    for _ in range(50):  # bounded: the GET may not be open yet when the first call lands
        got = raw.post(json.dumps(call(9, "retrieve_balance")).encode())
        assert got.status_code == 200 and not got.json()["result"].get("isError")
        if seen.wait(0.2):
            break
    assert seen.is_set(), lines
    assert "balance retrieved" in "".join(lines)


REFUND_X = json.dumps(call(1, "create_refund", payment_intent="pi_x")).encode()


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"ping"}', {}),
        (json.dumps(call(1, "create_refund", payment_intent="pi_x", amount=1.5)).encode(), {}),
        (json.dumps(call(1, "create_refund", payment_intent="pi_x")).encode("utf-16"), {}),
        (
            json.dumps(call(1, "create_refund", payment_intent="pi_x")).encode(),
            {"X-HTTP-Method-Override": "GET"},
        ),
        (json.dumps(call(1, "delete_everything")).encode(), {}),
        (
            json.dumps(call(1, "create_refund", payment_intent="pi_x")).encode(),
            {"Stripe-Account": "nope"},
        ),
        (
            json.dumps(call(1, "create_refund", payment_intent="pi_x")).encode(),
            {"Stripe-Context": "acct_1"},
        ),
    ],
)
def test_what_ctrlrun_cannot_allow_reaches_nothing(
    sc: Sidecar,
    fakes: tuple[FakeStripe, FakeKubernetes],
    mcp_server: FakeStripeMcp,
    body: bytes,
    headers: dict[str, str],
) -> None:
    raw = Raw(mcp_server.url, sc.proxy_url)
    raw.open()
    before = len(mcp_server.received)
    got = raw.post(body, **headers)
    assert got.headers.get("x-ctrlrun-outcome") in ("invalid_request", "denied"), got.text
    answer = got.json()
    message = answer.get("error", {}).get("message") or answer["result"]["content"][0]["text"]
    assert message.startswith("ctrlrun: ")
    assert len(mcp_server.received) == before  # nothing forwarded
    assert fakes[0].refunds == []


def test_rest_then_mcp_and_mcp_then_rest_are_one_refund_each(
    sc: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], mcp_server: FakeStripeMcp
) -> None:
    stripe = fakes[0]
    first, second = (stripe.add_payment_intent(amount=5000)["id"] for _ in range(2))
    client = stripe_client(sc.stripe_base, retries=0)
    raw = Raw(mcp_server.url, sc.proxy_url)
    raw.open()

    refund(client, first, 400)
    again = raw.post(
        json.dumps(call(1, "create_refund", payment_intent=first, amount=400)).encode()
    )
    assert again.json()["result"]["_meta"]["com.ctrlrun/receipt"]["outcome"] == "duplicate"

    made = raw.post(
        json.dumps(call(2, "create_refund", payment_intent=second, amount=400)).encode()
    )
    assert not made.json()["result"].get("isError"), made.text
    err = refused(lambda: refund(client, second, 400))
    assert (err.json_body or {})["ctrlrun"]["outcome"] == "duplicate"
    assert sorted(r["payment_intent"] for r in stripe.refunds) == sorted([first, second])


def test_a_refund_without_amount_is_refused_where_the_policy_reads_amount(
    sc: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], mcp_server: FakeStripeMcp
) -> None:
    pi = fakes[0].add_payment_intent(amount=5000)["id"]
    raw = Raw(mcp_server.url, sc.proxy_url)
    raw.open()
    got = raw.post(json.dumps(call(1, "create_refund", payment_intent=pi)).encode()).json()
    block = got["result"]["_meta"]["com.ctrlrun/receipt"]
    assert (block["outcome"], block["reason"]) == ("invalid_request", "amount_required")
    assert fakes[0].refunds == []
