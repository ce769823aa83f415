"""A tool call's JSON-RPC id, through the sidecar against real FastMCP servers (the official
``mcp`` SDK's Streamable HTTP transport), one of them stateless on a single transport shared
by every client.

That transport routes each answer by its id, to the newest request holding it. ctrlrun
forwards each tool call with an id of its own, so no other request (another agent's on a
shared transport, one passed through that never ends, one the agent hung up on) answers a
call in its place, and no id is held against a later request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from harness import Sidecar, start_sidecar
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp_support import session
from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send
from test_attacks_mcp5 import COMPLETE, POLICY, Orders, _messages
from test_mcp_wire import Raw, call

from ctrlrun.proxy.mcp_ids import restore
from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(120)
READS = POLICY + "      list_orders: read\n"


def _shared_transport(orders: Orders, *, json_response: bool) -> None:
    """Serve ``orders`` statelessly on ONE transport for every client (no Mcp-Session-Id)."""
    low = orders.server.mcp._mcp_server
    transport = StreamableHTTPServerTransport(
        mcp_session_id=None, is_json_response_enabled=json_response
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                async with transport.connect() as (read, write):
                    options = low.create_initialization_options()
                    await low.run(read, write, options, stateless=True)

            tg.start_soon(run)
            yield
            tg.cancel_scope.cancel()

    async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        await transport.handle_request(scope, receive, send)

    app = Starlette(lifespan=lifespan)
    app.mount("/", endpoint)
    orders.server.mcp.streamable_http_app = lambda: app  # type: ignore[method-assign]


@pytest.fixture(params=[True, False], ids=["json", "sse"])
def shared(
    request: pytest.FixtureRequest, fakes: tuple[FakeStripe, FakeKubernetes]
) -> Iterator[Orders]:
    made = Orders(fakes[0], json_response=request.param)
    _shared_transport(made, json_response=request.param)
    with made.server:
        yield made


@pytest.fixture
def shared_sc(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes], shared: Orders
) -> Iterator[Sidecar]:
    sidecar = start_sidecar(
        tmp_path, *fakes, policy_text=POLICY.format(url=shared.server.url), in_process=True
    )
    yield sidecar
    sidecar.stop()


@pytest.fixture(params=[True, False], ids=["json", "sse"])
def orders(
    request: pytest.FixtureRequest, fakes: tuple[FakeStripe, FakeKubernetes]
) -> Iterator[Orders]:
    made = Orders(fakes[0], json_response=request.param)
    with made.server:
        yield made


@pytest.fixture
def sc(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes], orders: Orders
) -> Iterator[Sidecar]:
    text = POLICY.format(url=orders.server.url)
    sidecar = start_sidecar(tmp_path, *fakes, policy_text=text, in_process=True)
    yield sidecar
    sidecar.stop()


@pytest.fixture
def raw(sc: Sidecar, orders: Orders) -> Raw:
    opened = Raw(orders.server.url, sc.proxy_url)
    opened.open()
    return opened


def _stateless(orders: Orders, sc: Sidecar) -> Raw:
    raw = Raw(orders.server.url, sc.proxy_url)
    first = raw.post(_INIT)
    assert first.status_code == 200, first.text
    assert "mcp-session-id" not in first.headers
    return raw


_INIT = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"},
        },
    }
).encode()


def _until(check: Any, seconds: float = 10) -> bool:
    for _ in range(int(seconds / 0.02)):  # bounded
        if check():
            return True
        threading.Event().wait(0.02)
    return False


def _sent_calls(orders: Orders) -> list[dict[str, Any]]:
    out = []
    for body in orders.server.received:
        value = json.loads(body)
        if isinstance(value, dict) and value.get("method") == "tools/call":
            out.append(value)
    return out


def test_another_agents_request_on_a_shared_stateless_transport_answers_no_call(
    shared: Orders, shared_sc: Sidecar
) -> None:
    # Agent A's completion (id 5, passed through) is in flight when agent B's refund with id
    # 5 arrives: on one transport, the completion's -32602 would be B's answer, the refund
    # recorded failed while it ran, and B's retry would refund again.
    a, b = _stateless(shared, shared_sc), _stateless(shared, shared_sc)
    answers: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: answers.append(a.post(json.dumps(COMPLETE).encode())))
    thread.start()
    try:
        assert _until(lambda: any(b"completion/complete" in x for x in shared.server.received))
        got = b.post(json.dumps(call(5, "refund_order", order_id=7, amount=100)).encode())
    finally:
        thread.join(30)
    mine = _messages(got)[-1]
    assert mine["id"] == 5 and mine["result"]["isError"] is False, got.text
    assert [m.get("error", {}).get("code") for m in _messages(answers[0])] == [-32602]
    assert shared.refunds == [(7, 100)]
    again = b.post(json.dumps(call(6, "refund_order", order_id=7, amount=100)).encode())
    assert "duplicate" in again.text, again.text
    assert shared.refunds == [(7, 100)]


def test_official_clients_sharing_one_stateless_transport_each_get_their_own_answer(
    shared: Orders, shared_sc: Sidecar
) -> None:
    # Both clients number their call 2: on one transport the second's stream took the
    # first's answer, and the first waited for an answer that went elsewhere. (Their
    # tools/list, passed through, is listed first: two of them at once, both with id 1, would
    # cross there too, the server's own doing and no record's.)
    async def agent(order: int) -> Any:
        async with session(shared.server.url, shared_sc.proxy_url) as s:
            await s.list_tools()
            return await s.call_tool("refund_order", {"order_id": order, "amount": 100})

    async def both() -> list[Any]:
        first = asyncio.create_task(agent(7))
        assert await asyncio.to_thread(shared.tool_started.wait, 15)
        second = asyncio.create_task(agent(8))
        await asyncio.sleep(0.5)
        shared.completed.set()
        return list(await asyncio.gather(first, second))

    results = asyncio.run(both())
    assert [r.isError for r in results] == [False, False], results
    assert [json.loads(r.content[0].text) for r in results] == [{"refunded": 7}, {"refunded": 8}]
    assert sorted(shared.refunds) == [(7, 100), (8, 100)]


def test_a_passed_request_that_never_ends_holds_up_no_call_with_its_id(
    sc: Sidecar, raw: Raw, orders: Orders
) -> None:
    # The completion answers only once a tool has begun: until then its POST stays open (a
    # slow loris). The call with its id goes, once, and is recorded by its own answer.
    answers: list[httpx.Response] = []
    thread = threading.Thread(
        target=lambda: answers.append(raw.post(json.dumps(COMPLETE).encode()))
    )
    thread.start()
    try:
        assert _until(lambda: any(b"completion/complete" in x for x in orders.server.received))
        got = raw.post(json.dumps(call(5, "refund_order", order_id=7, amount=100)).encode())
    finally:
        thread.join(30)
    mine = _messages(got)[-1]
    assert mine["id"] == 5 and mine["result"]["isError"] is False, got.text
    assert orders.refunds == [(7, 100)]
    # The id was never held: the next request with it goes too.
    ping = raw.post(b'{"jsonrpc":"2.0","id":5,"method":"ping"}')
    assert ping.status_code == 200 and _messages(ping)[-1]["id"] == 5, ping.text


@pytest.mark.parametrize("rid", [7, "seven", 0, -3, "5"])
def test_the_server_sees_ctrlruns_id_and_the_agent_gets_its_own(
    raw: Raw, orders: Orders, rid: Any
) -> None:
    orders.completed.set()
    got = raw.post(json.dumps(call(rid, "refund_order", order_id=7, amount=100)).encode())
    assert got.status_code == 200, got.text
    answer = _messages(got)[-1]
    assert answer["id"] == rid and type(answer["id"]) is type(rid), got.text
    assert answer["result"]["isError"] is False, got.text
    sent = _sent_calls(orders)
    assert len(sent) == 1 and str(sent[0]["id"]).startswith("ctrlrun-"), sent
    assert sent[0]["params"] == {
        "name": "refund_order",
        "arguments": {"order_id": 7, "amount": 100},
    }


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "id": "ctrlrun-0123456789abcdef", "method": "ping"},
        {"jsonrpc": "2.0", "id": "CTRLRUN-x", "method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": "ctrlrun-0123456789abcdef"},
        },
        [{"jsonrpc": "2.0", "id": 1, "method": "ping"}, call("ctrlrun-1", "refund_order")],
    ],
)
def test_ctrlruns_own_ids_are_refused_from_the_agent(
    raw: Raw, orders: Orders, message: Any
) -> None:
    before = len(orders.server.received)
    got = raw.post(json.dumps(message).encode())
    assert got.status_code == 400, got.text
    assert "ctrlrun's own" in got.json()["error"]["message"], got.text
    assert len(orders.server.received) == before  # nothing forwarded


def test_a_read_tool_in_a_batch_gets_its_answer_under_the_agents_id(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    made = Orders(fakes[0], json_response=True)

    @made.server.mcp.tool()
    def list_orders() -> str:
        """The orders."""
        return "[7]"

    with made.server:
        made.completed.set()
        sc = start_sidecar(
            tmp_path, *fakes, policy_text=READS.format(url=made.server.url), in_process=True
        )
        try:
            raw = Raw(made.server.url, sc.proxy_url)
            raw.open()
            batch = [call(1, "list_orders"), call(2, "refund_order", order_id=7, amount=100)]
            got = raw.post(json.dumps(batch).encode())
        finally:
            sc.stop()
    assert got.status_code == 200, got.text
    answers = {a["id"]: a for a in got.json()}
    assert set(answers) == {1, 2}, got.text
    assert answers[1]["result"]["content"][0]["text"] == "[7]", got.text
    assert answers[2]["result"]["isError"] is False, got.text
    assert made.refunds == [(7, 100)]


W = "ctrlrun-00ff"
SSE = (("Content-Type", "text/event-stream"),)


def test_an_sse_answer_gets_the_agents_id_back_and_the_rest_as_it_came() -> None:
    progress = b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":5}}'
    body = (
        b"id: ev1\r\nevent: message\r\ndata: " + progress + b"\r\n\r\n"
        b'id: ev2\r\nevent: message\r\ndata: {"jsonrpc":"2.0",\r\ndata: "id":"ctrlrun-00ff",'
        b'"result":{"content":[]}}\r\n\r\n'
        b'data: {"jsonrpc":"2.0","id":"ctrlrun-00ff","res'
    )
    got = restore(SSE, body, W, 5).decode()
    blocks = got.split("\n\n")
    assert blocks[0] == "id: ev1\nevent: message\ndata: " + progress.decode()
    assert (
        blocks[1]
        == 'id: ev2\nevent: message\ndata: {"jsonrpc":"2.0","id":5,"result":{"content":[]}}'
    )
    assert blocks[2] == 'data: {"jsonrpc":"2.0","id":"ctrlrun-00ff","res'  # it never finished


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            b'{"jsonrpc":"2.0","id":"ctrlrun-00ff","result":{}}',
            {"jsonrpc": "2.0", "id": "a", "result": {}},
        ),
        (
            b'[{"jsonrpc":"2.0","id":"ctrlrun-00ff","error":{"code":1}}]',
            [{"jsonrpc": "2.0", "id": "a", "error": {"code": 1}}],
        ),
        # A request of the server with ctrlrun's id, or a response to another id: untouched.
        (
            b'{"jsonrpc":"2.0","id":"ctrlrun-00ff","method":"ping"}',
            {"jsonrpc": "2.0", "id": W, "method": "ping"},
        ),
        (
            b'{"jsonrpc":"2.0","id":"ctrlrun-00fe","result":{}}',
            {"jsonrpc": "2.0", "id": "ctrlrun-00fe", "result": {}},
        ),
    ],
)
def test_a_json_answer_gets_the_agents_id_back(body: bytes, expected: Any) -> None:
    got = restore((("content-type", "application/json; charset=utf-8"),), body, W, "a")
    assert json.loads(got) == expected


@pytest.mark.parametrize("kind", ["application/json", "text/event-stream", "text/plain"])
def test_an_answer_that_cannot_be_read_is_returned_as_it_came(kind: str) -> None:
    body = b'\xff{"id":"ctrlrun-00ff"\n\n'
    assert restore((("Content-Type", kind),), body, W, 1) == body


@pytest.mark.parametrize("path", ["//", "/%2F", "/./", "/x/../", "/MCP", "/mcp/", "/?a=1"])
def test_a_call_spelt_to_another_path_of_the_host_is_decided_by_its_one_map(
    raw: Raw, orders: Orders, path: str
) -> None:
    # An upstream is a host: every path of it is decided by its one tools: map, so no path
    # variant reaches the server as a call ctrlrun did not decide.
    orders.completed.set()
    first = raw.post(json.dumps(call(1, "refund_order", order_id=7, amount=100)).encode())
    assert _messages(first)[-1]["result"]["isError"] is False, first.text
    before = len(orders.server.received)
    hdrs = {**raw.headers, "Content-Type": "application/json"}
    body = json.dumps(call(2, "refund_order", order_id=7, amount=100)).encode()
    got = raw.http.post(raw.url + path, content=body, headers=hdrs)
    assert "duplicate" in got.text, got.text
    assert len(orders.server.received) == before and orders.refunds == [(7, 100)]
