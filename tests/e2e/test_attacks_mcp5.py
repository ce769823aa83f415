"""MCP requests that share a JSON-RPC id or a session with a tool call, through the sidecar
against a real FastMCP server (the official ``mcp`` SDK's Streamable HTTP transport).

That transport routes every answer by its id, to the newest request that holds it: a request
ctrlrun passes through (a completion, a prompt) still in flight when a tool call with its id
arrives would answer the tool call, and the call's record would be the other's answer, were
the call forwarded with the agent's id rather than one of ctrlrun's own.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import Sidecar, start_sidecar
from mcp.shared.exceptions import McpError
from mcp.types import INVALID_PARAMS, Completion, ErrorData
from mcp_support import ledger_json, session
from pydantic import AnyUrl
from test_mcp_wire import Raw, call

from ctrlrun.errors import PolicyError
from ctrlrun.proxy.config_parse import policy_from_yaml
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
"""


async def _until(event: threading.Event, seconds: float) -> bool:
    for _ in range(int(seconds / 0.02)):  # bounded
        if event.is_set():
            return True
        await asyncio.sleep(0.02)
    return False


class Orders:
    """A FastMCP server: a refund tool, and a completion that answers once a tool has begun."""

    def __init__(self, stripe: FakeStripe, *, json_response: bool) -> None:
        self.server = FakeStripeMcp(stripe, json_response=json_response)
        self.refunds: list[tuple[int, int]] = []
        self.tool_started, self.completed = threading.Event(), threading.Event()

        @self.server.mcp.tool()
        async def refund_order(order_id: int, amount: int) -> str:
            """Refund an order, after the completion in flight has answered."""
            self.tool_started.set()
            await _until(self.completed, 10)
            await asyncio.sleep(0.2)
            self.refunds.append((order_id, amount))
            return json.dumps({"refunded": order_id})

        @self.server.mcp.completion()
        async def complete(ref: Any, argument: Any, context: Any) -> Completion:
            # A lookup that takes a while, then: the argument is unknown (-32602, as a
            # server answers a request it did not run).
            await _until(self.tool_started, 3)
            self.completed.set()
            raise McpError(ErrorData(code=INVALID_PARAMS, message="no such argument"))


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
    session = Raw(orders.server.url, sc.proxy_url)
    session.open()
    return session


def _messages(got: Any) -> list[dict[str, Any]]:
    kind = got.headers.get("content-type", "")
    if kind.startswith("text/event-stream"):
        blocks = got.text.replace("\r\n", "\n").split("\n\n")
        datas = [
            "\n".join(line[5:].lstrip() for line in b.split("\n") if line.startswith("data:"))
            for b in blocks
        ]
        return [json.loads(d) for d in datas if d]
    value = got.json()
    return value if isinstance(value, list) else [value]


COMPLETE = {
    "jsonrpc": "2.0",
    "id": 5,
    "method": "completion/complete",
    "params": {"ref": {"type": "ref/prompt", "name": "p"}, "argument": {"name": "a", "value": ""}},
}


def test_a_tool_call_reusing_the_id_of_a_passed_request_in_flight_gets_its_own_answer(
    raw: Raw, orders: Orders
) -> None:
    # Forwarded with id 5, the call would take the completion's -32602 (the transport sends
    # an answer to the newest request holding its id) and be recorded failed while the tool
    # ran. ctrlrun forwards it with an id of its own.
    answers: list[Any] = []
    thread = threading.Thread(
        target=lambda: answers.append(raw.post(json.dumps(COMPLETE).encode()))
    )
    thread.start()
    try:
        for _ in range(100):  # bounded: the completion has reached the server
            if any(b'"completion/complete"' in body for body in orders.server.received):
                break
            threading.Event().wait(0.02)
        refund = call(5, "refund_order", order_id=7, amount=100)
        got = raw.post(json.dumps(refund).encode())
        assert got.status_code == 200, got.text
        assert _messages(got)[-1]["result"]["isError"] is False, got.text
    finally:
        thread.join(30)
    # The completion's answer is its own (-32602).
    assert [m.get("error", {}).get("code") for m in _messages(answers[0])] == [INVALID_PARAMS]
    assert orders.refunds == [(7, 100)]
    # Recorded committed: the same refund, asked again, is a duplicate.
    again = raw.post(json.dumps(call(6, "refund_order", order_id=7, amount=100)).encode())
    assert "duplicate" in again.text, again.text
    assert orders.refunds == [(7, 100)]


def _until_sync(check: Any, seconds: float = 10) -> bool:
    for _ in range(int(seconds / 0.02)):  # bounded
        if check():
            return True
        threading.Event().wait(0.02)
    return False


def test_a_tool_call_reusing_the_id_of_a_request_the_agent_hung_up_on_gets_its_own_answer(
    sc: Sidecar, raw: Raw, orders: Orders
) -> None:
    # The agent gives up on the completion; the server still answers it, later, to whichever
    # request of the session then holds id 5: never the call, which ctrlrun forwards under
    # an id of its own.
    impatient = Raw(orders.server.url, sc.proxy_url)
    impatient.headers = dict(raw.headers)
    impatient.http = httpx.Client(proxy=sc.proxy_url, trust_env=False, timeout=0.5)
    with pytest.raises(httpx.TimeoutException):
        impatient.post(json.dumps(COMPLETE).encode())
    assert _until_sync(lambda: any(b"completion/complete" in b for b in orders.server.received))
    threading.Event().wait(0.3)  # the proxy has seen the agent hang up
    got = raw.post(json.dumps(call(5, "refund_order", order_id=7, amount=100)).encode())
    assert got.status_code == 200 and not _messages(got)[-1]["result"]["isError"], got.text
    assert orders.refunds == [(7, 100)]
    again = raw.post(json.dumps(call(6, "refund_order", order_id=7, amount=100)).encode())
    assert "duplicate" in again.text, again.text
    assert orders.refunds == [(7, 100)]


@pytest.mark.parametrize("other", [b"5", b"5.0", b"5.5", b"5e0", b'"5"'])
def test_an_id_a_server_reads_as_the_call_in_flight_is_answered_as_its_own(
    raw: Raw, orders: Orders, other: bytes
) -> None:
    # 5.0 is 5 to JavaScript, 5.5 to Go's jsonrpc2, "5" to the mcp SDK's streams: none of
    # them is the id the call was forwarded with.
    answers: list[Any] = []
    body = json.dumps(call(5, "refund_order", order_id=7, amount=100)).encode()
    thread = threading.Thread(target=lambda: answers.append(raw.post(body)))
    thread.start()
    try:
        assert orders.tool_started.wait(15)
        got = raw.post(b'{"jsonrpc":"2.0","id":' + other + b',"method":"ping"}')
        assert got.status_code in (200, 202, 400), got.text  # the server's own answer
        assert "ctrlrun" not in got.text, got.text
    finally:
        orders.completed.set()
        thread.join(30)
    assert answers[0].status_code == 200 and not _messages(answers[0])[-1]["result"]["isError"], (
        answers[0].text
    )
    assert orders.refunds == [(7, 100)]


def test_a_request_naming_two_sessions_is_refused(raw: Raw, orders: Orders) -> None:
    # The server reads the first Mcp-Session-Id, a proxy keeping the last would judge the
    # request as another session's than the one the server serves it in.
    session = raw.headers["Mcp-Session-Id"]
    base = [(k, v) for k, v in raw.headers.items() if k != "Mcp-Session-Id"]
    base.append(("Content-Type", "application/json"))
    before = len(orders.server.received)
    for pair in ([session, "another"], ["another", session]):
        headers = base + [("Mcp-Session-Id", value) for value in pair]
        got = raw.http.post(raw.url, content=json.dumps(COMPLETE).encode(), headers=headers)
        assert got.status_code == 400, got.text
        assert "Mcp-Session-Id" in got.json()["error"]["message"], got.text
    assert len(orders.server.received) == before  # nothing forwarded
    one = raw.post(b'{"jsonrpc":"2.0","id":9,"method":"ping"}')
    assert one.status_code == 200, one.text


REFUSING = POLICY + "    refuse_methods: [resources/read, prompts/get]\n"


@pytest.fixture
def acting(fakes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[tuple[FakeStripeMcp, list[str]]]:
    """A FastMCP server whose resource and prompt act (they send an invoice)."""
    server = FakeStripeMcp(fakes[0])
    sent: list[str] = []

    @server.mcp.resource("invoices://{invoice}/send")
    def send_invoice(invoice: str) -> str:
        sent.append(invoice)
        return f"sent {invoice}"

    @server.mcp.prompt()
    def remind(invoice: str) -> str:
        sent.append(f"reminded {invoice}")
        return f"remind {invoice}"

    with server:
        yield server, sent


def test_methods_the_upstream_refuses_are_refused_with_a_receipt(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes], acting: Any
) -> None:
    server, sent = acting
    text = REFUSING.format(url=server.url)
    sc = start_sidecar(tmp_path, *fakes, policy_text=text, in_process=True)
    try:

        async def agent() -> list[str]:
            async with session(server.url, sc.proxy_url) as s:
                templates = await s.list_resource_templates()  # a read: passes
                assert [t.name for t in templates.resourceTemplates] == ["send_invoice"]
                errors = []
                for ask in (
                    s.read_resource(AnyUrl("invoices://in_1/send")),
                    s.get_prompt("remind", {"invoice": "in_1"}),
                ):
                    with pytest.raises(McpError) as raised:
                        await ask
                    errors.append(raised.value.error.message)
                return errors

        errors = asyncio.run(agent())
        assert all(e.startswith("ctrlrun: upstream 'orders' refuses") for e in errors), errors
        assert sent == []  # nothing reached the server
        denied = [r for r in ledger_json(sc) if r.get("action") == "orders.refused_method"]
        assert [r["result"] for r in denied] == ["denied", "denied"], denied
    finally:
        sc.stop()


@pytest.mark.parametrize("method", ["tools/call", "initialize", "ping", "Resources/read", 3])
def test_refuse_methods_names_only_methods_it_can_refuse(method: Any) -> None:
    text = REFUSING.format(url="http://127.0.0.1:1").replace("{{", "{").replace("}}", "}")
    text = text.replace("resources/read", json.dumps(method))
    with pytest.raises(PolicyError, match="refuse_methods"):
        policy_from_yaml(text)
    policy_from_yaml(
        REFUSING.format(url="http://127.0.0.1:1").replace("{{", "{").replace("}}", "}")
    )


@pytest.fixture
def tasking(fakes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[FakeStripeMcp]:
    """A server that runs a task-augmented tool call as a task (the mcp SDK's lowlevel
    tasks), answering at once with the task it created; the refund then fails."""
    server = FakeStripeMcp(fakes[0], json_response=True)
    low = server.mcp._mcp_server
    low.experimental.enable_tasks()

    @low.call_tool()
    async def handle(name: str, arguments: dict[str, Any]) -> Any:
        async def work(task: Any) -> Any:
            await asyncio.sleep(0.2)
            raise RuntimeError("the card issuer declined the refund")

        return await low.request_context.experimental.run_task(work)

    with server:
        yield server


def test_a_tool_call_run_as_a_task_is_not_recorded_committed(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes], tasking: FakeStripeMcp
) -> None:
    sc = start_sidecar(
        tmp_path, *fakes, policy_text=POLICY.format(url=tasking.url), in_process=True
    )
    try:
        raw = Raw(tasking.url, sc.proxy_url)
        raw.open()
        message = call(1, "refund_order", order_id=7, amount=100)
        message["params"]["task"] = {"ttl": 60000}
        got = raw.post(json.dumps(message).encode())
        assert got.status_code == 200, got.text
        task = got.json()["result"]["task"]  # the server's own answer reaches the agent
        asked = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tasks/get",
            "params": {"taskId": task["taskId"]},
        }
        assert _until_sync(
            lambda: raw.post(json.dumps(asked).encode()).json()["result"]["status"] == "failed"
        )
        rows = [r for r in ledger_json(sc) if r.get("action") == "orders.refund"]
        assert [r["result"] for r in rows] == ["ambiguous"], rows  # not committed: it failed
        again = raw.post(json.dumps(call(3, "refund_order", order_id=7, amount=100)).encode())
        assert "ambiguous" in again.text, again.text  # until a human or a reconciler settles it
    finally:
        sc.stop()


def test_stateless_sessions_calling_at_once_with_one_id_are_not_refused(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    # Without a session the server serves each request on a transport of its own (the mcp
    # SDK's stateless mode; the TypeScript SDK refuses to reuse one): two agents' calls
    # with id 1 share nothing there.
    made = Orders(fakes[0], json_response=True)
    made.server.mcp.settings.stateless_http = True
    with made.server:
        text = POLICY.format(url=made.server.url)
        sc = start_sidecar(tmp_path, *fakes, policy_text=text, in_process=True)
        try:

            async def agent(order: int) -> Any:
                async with session(made.server.url, sc.proxy_url) as s:
                    return await s.call_tool("refund_order", {"order_id": order, "amount": 100})

            async def both() -> list[Any]:
                first = asyncio.create_task(agent(7))
                assert await asyncio.to_thread(made.tool_started.wait, 15)
                second = asyncio.create_task(agent(8))
                await asyncio.sleep(0.5)
                made.completed.set()
                return list(await asyncio.gather(first, second))

            results = asyncio.run(both())
            assert [r.isError for r in results] == [False, False], results
            assert sorted(made.refunds) == [(7, 100), (8, 100)]
        finally:
            sc.stop()


def test_escapes_in_the_method_and_the_tool_name_are_read_as_the_server_reads_them(
    raw: Raw, orders: Orders
) -> None:
    orders.completed.set()
    first = raw.post(json.dumps(call(1, "refund_order", order_id=7, amount=100)).encode())
    assert not _messages(first)[-1]["result"]["isError"], first.text
    for rid, body in enumerate(
        (
            '"method":"tools\\/call","params":{"name":"refund\\u005forder",',
            '"method":"tools/c\\u0061ll","params":{"n\\u0061me":"refund_order",',
        ),
        start=2,
    ):
        raw_body = (
            f'{{"jsonrpc":"2.0","id":{rid},{body}"arguments":{{"order_id":7,"amount":100}}}}}}'
        )
        got = raw.post(raw_body.encode())
        assert "duplicate" in got.text, got.text
    assert orders.refunds == [(7, 100)]


def test_a_batch_of_two_calls_to_one_effect_runs_it_once(raw: Raw, orders: Orders) -> None:
    orders.completed.set()
    batch = [call(i, "refund_order", order_id=7, amount=100) for i in (1, 2)]
    got = raw.post(json.dumps(batch).encode())
    assert got.status_code == 200, got.text
    answers = {a["id"]: a["result"] for a in got.json()}
    assert not answers[1]["isError"], answers
    assert answers[2]["_meta"]["com.ctrlrun/receipt"]["outcome"] == "duplicate", answers
    assert orders.refunds == [(7, 100)]
