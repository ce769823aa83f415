"""Spans and decision lines for the two paths that are not a plain protected request: an MCP
tool call through the sidecar, and a Kubernetes write that the apiserver's dry run decides
without forwarding it (refused by ctrlrun, or answered by the apiserver itself)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import KUBE_TOKEN, STRIPE_KEY, Sidecar, running_sidecar
from mcp_support import POLICY, ledger_json
from otel_support import json_lines, memory_exporter

from ctrlrun.testing import FakeKubernetes, FakeStripe
from ctrlrun.testing.stripe_mcp import FakeStripeMcp

pytestmark = pytest.mark.timeout(120)
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT}-01"
FIELDS = ("action", "outcome", "reason", "receipt_id", "policy_hash", "agent", "trace_id")
INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}


def call(rid: int, name: str, **arguments: Any) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


class Mcp:
    """A hand-driven MCP session through the sidecar, every message carrying the traceparent."""

    def __init__(self, url: str, proxy: str) -> None:
        self.url, self.http = url, httpx.Client(proxy=proxy, trust_env=False, timeout=30)
        self.headers = {
            "Authorization": f"Bearer {STRIPE_KEY}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "traceparent": TRACEPARENT,
        }
        first = self.post(INIT)
        assert first.status_code == 200, first.text
        self.headers["Mcp-Session-Id"] = first.headers["mcp-session-id"]
        self.headers["Mcp-Protocol-Version"] = "2025-06-18"
        assert self.post({"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code

    def post(self, message: Any) -> httpx.Response:
        return self.http.post(self.url, content=json.dumps(message), headers=self.headers)


@pytest.fixture
def mcp_rig(mcp_sidecar: Sidecar, mcp_server: FakeStripeMcp) -> tuple[Sidecar, FakeStripeMcp]:
    return mcp_sidecar, mcp_server  # the conftest's


def ours(exporter: Any) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(("stripe.", "k8s."))]


def under_the_agents_trace(span: Any) -> None:
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == PARENT
    assert span.attributes["ctrlrun.policy_hash"].startswith("sha256:")


def test_each_tool_call_is_a_span_and_its_decision_line_carries_the_fields(
    mcp_rig: tuple[Sidecar, FakeStripeMcp], fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    exporter = memory_exporter()
    sc, server = mcp_rig
    pi = fakes[0].add_payment_intent(amount=5000)["id"]
    mcp = Mcp(server.url, sc.proxy_url)
    with json_lines() as docs:
        batch = [
            call(1, "create_refund", payment_intent=pi, amount=300),
            call(2, "create_payout", amount=100),
        ]
        assert mcp.post(batch).status_code == 200
        assert mcp.post(call(3, "retrieve_balance")).status_code == 200  # a read: no span
    spans = ours(exporter)
    assert sorted(s.name for s in spans) == ["stripe.payout", "stripe.refund"]
    assert len(exporter.get_finished_spans()) == 2
    by_name = {s.name: s.attributes for s in spans}
    for span in spans:
        under_the_agents_trace(span)
    refund, payout = by_name["stripe.refund"], by_name["stripe.payout"]
    assert refund["ctrlrun.action"] == "stripe.refund"
    assert refund["ctrlrun.effect_key"] == f"refund:{fakes[0].platform_id}:{pi}"
    assert refund["ctrlrun.outcome"] == "committed" and refund["ctrlrun.receipt_id"]
    assert payout["ctrlrun.outcome"] == "denied"
    assert not any("amount" in k or "payment" in k for s in spans for k in s.attributes)

    committed = [d for d in docs if d.get("outcome") == "committed"]
    refused = [d for d in docs if d.get("outcome") == "denied" and "tools/call" in d["message"]]
    assert committed and refused
    assert all(refused[0].get(f) for f in FIELDS), refused[0]
    assert all(committed[0].get(f) for f in FIELDS if f != "reason"), committed[0]  # none
    assert committed[0]["effect_key"] == f"refund:{fakes[0].platform_id}:{pi}"
    assert {d["trace_id"] for d in docs if "outcome" in d} == {TRACE_ID}
    assert STRIPE_KEY not in json.dumps(docs)
    receipts = [r for r in ledger_json(sc) if r["kind"] == "receipt"]
    assert sorted(r["action"] for r in receipts) == ["stripe.payout", "stripe.refund"]
    assert all(r["trace_id"] == TRACE_ID for r in receipts)  # the agent's trace, recorded


@pytest.fixture
def kube_sidecar(tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[Sidecar]:
    with running_sidecar(tmp_path, fakes[0], fakes[1], in_process=True) as sc:
        yield sc


DEPLOY = "/apis/apps/v1/namespaces/default/deployments/checkout"
SMP = "application/strategic-merge-patch+json"


def test_a_kubernetes_write_decided_on_its_dry_run_alone_is_a_span_and_a_decision_line(
    kube_sidecar: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    exporter = memory_exporter()
    sc, kube = kube_sidecar, fakes[1]
    headers = {"Authorization": f"Bearer {KUBE_TOKEN}", "traceparent": TRACEPARENT}
    both = {"spec": {"replicas": 4, "template": {"spec": {"containers": [{"name": "app"}]}}}}
    both["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:1"
    retain = {"spec": {"$retainKeys": ["replicas"], "replicas": 4}}  # the apiserver refuses it
    with json_lines() as docs, httpx.Client(base_url=sc.kube_base, timeout=30) as client:
        mixed = client.patch(
            DEPLOY, content=json.dumps(both), headers={**headers, "Content-Type": SMP}
        )
        remote = client.patch(
            DEPLOY, content=json.dumps(retain), headers={**headers, "Content-Type": SMP}
        )
    assert mixed.status_code == 422 and mixed.headers["x-ctrlrun-outcome"] == "invalid_request"
    assert remote.status_code == 422 and "x-ctrlrun-outcome" not in remote.headers
    assert kube.writes_applied == 0 and kube.replicas("default", "checkout") == 3

    spans = ours(exporter)
    assert [s.name for s in spans] == ["k8s.update_deployment", "k8s.update_deployment"]
    for span in spans:
        under_the_agents_trace(span)
    first, second = (s.attributes for s in spans)
    assert first["ctrlrun.outcome"] == "invalid_request" and first["ctrlrun.receipt_id"]
    assert second["ctrlrun.outcome"] == "refused_by_remote"

    lines = [d for d in docs if d.get("action") == "k8s.update_deployment"]
    assert [d["outcome"] for d in lines] == ["invalid_request", "refused_by_remote"]
    assert all(d.get(f) for f in FIELDS for d in lines[:1]), lines
    assert all(d["trace_id"] == TRACE_ID and d["agent"] and d["policy_hash"] for d in lines)
    assert '"evil:1"' not in json.dumps(docs) and KUBE_TOKEN not in json.dumps(docs)
    receipts = [
        json.loads(line)
        for line in sc.cli("receipts", "--json", "--store-url", sc.store_url).stdout.splitlines()
    ]
    (receipt,) = [r for r in receipts if r.get("kind") == "receipt"]  # ctrlrun's refusal only
    assert receipt["receipt_id"] == first["ctrlrun.receipt_id"]
    assert receipt["action"] == "k8s.update_deployment" and receipt["trace_id"] == TRACE_ID


GENERIC = """\
  billing:
    profile: mcp
    url: {url}
    unmapped_tools: allow
"""


def test_an_unmapped_tool_call_forwarded_is_a_span_and_a_decision_line(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    exporter = memory_exporter()
    with (
        FakeStripeMcp(fakes[0], json_response=True) as stripe_mcp,
        FakeStripeMcp(fakes[0], json_response=True) as generic,
    ):
        text = POLICY.format(mcp=stripe_mcp.url) + GENERIC.format(url=generic.url)
        with running_sidecar(tmp_path, *fakes, policy_text=text, in_process=True) as sc:
            mcp = Mcp(generic.url, sc.proxy_url)
            with json_lines() as docs:
                got = mcp.post(call(1, "retrieve_balance"))
    assert got.status_code == 200 and not got.json()["result"].get("isError")
    (span,) = exporter.get_finished_spans()
    assert span.name == "billing.unmapped_tool"
    under_the_agents_trace(span)
    assert (
        span.attributes["ctrlrun.outcome"] == "committed" and span.attributes["ctrlrun.receipt_id"]
    )
    (line,) = [d for d in docs if d.get("action") == "billing.unmapped_tool"]
    assert all(line.get(f) for f in FIELDS), line
    assert line["reason"] == "unmapped_tools: allow" and line["trace_id"] == TRACE_ID
