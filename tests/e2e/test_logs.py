"""``--log-format json`` writes one JSON object per line: one INFO line per decision."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from harness import KUBE_TOKEN, running_sidecar
from otel_support import memory_exporter
from stripe_support import receipts_for

from ctrlrun.testing import FakeKubernetes, FakeStripe

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
SCALE = "/apis/apps/v1/namespaces/default/deployments/checkout/scale"
HEADERS = {
    "Content-Type": "application/merge-patch+json",
    "Authorization": f"Bearer {KUBE_TOKEN}",
    "traceparent": TRACEPARENT,
}


def test_json_logs_one_object_per_line_with_each_decision(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    stripe, kube = fakes
    with (
        running_sidecar(tmp_path, stripe, kube, extra_args=("--log-format", "json")) as sc,
        httpx.Client(timeout=15, trust_env=False) as client,
    ):
        scale = f"{sc.kube_base}{SCALE}"
        body = b'{"spec":{"replicas":4}}'
        assert client.patch(scale, headers=HEADERS, content=body).status_code == 200
        assert client.patch(scale, headers=HEADERS, content=body).status_code == 403
    lines = [line for line in sc.log.read_text().splitlines() if line.strip()]
    docs = [json.loads(line) for line in lines]  # every line is a JSON object
    assert all({"ts", "level", "logger", "message"} <= set(d) for d in docs)
    messages = [d["message"] for d in docs]
    assert any("k8s.scale committed key=scale:prod-eu:checkout:4" in m for m in messages)
    assert any("refused" in m and "duplicate" in m for m in messages)
    assert KUBE_TOKEN not in sc.log.read_text()
    assert '"replicas"' not in sc.log.read_text()  # never a body

    # Each decision's line carries its fields, not only a message; the trace is the agent's.
    committed = next(d for d in docs if d.get("outcome") == "committed")
    assert committed["action"] == "k8s.scale"
    assert committed["effect_key"] == "scale:prod-eu:checkout:4"
    assert committed["receipt_id"] and committed["policy_hash"]
    assert committed["trace_id"] == TRACE_ID
    assert committed["agent"]
    refused = [d for d in docs if d.get("outcome") == "duplicate"]
    assert refused and all(d["trace_id"] == TRACE_ID for d in refused)
    assert all(d["effect_key"] == "scale:prod-eu:checkout:4" for d in refused)
    assert all(d["receipt_id"] and d["reason"] == "committed" for d in refused)


def test_each_protected_request_is_a_span_under_the_agents_traceparent(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    exporter = memory_exporter()
    stripe, kube = fakes
    with (
        running_sidecar(tmp_path, stripe, kube, in_process=True) as sc,
        httpx.Client(timeout=15, trust_env=False) as client,
    ):
        scale, body = f"{sc.kube_base}{SCALE}", b'{"spec":{"replicas":5}}'
        assert client.patch(scale, headers=HEADERS, content=body).status_code == 200
        assert client.patch(scale, headers=HEADERS, content=body).status_code == 403
        assert client.get(scale, headers=HEADERS).status_code == 200  # a read: no span
    spans = [s for s in exporter.get_finished_spans() if s.name == "k8s.scale"]
    assert len(spans) == 2 and len(exporter.get_finished_spans()) == 2
    for span in spans:
        assert format(span.context.trace_id, "032x") == TRACE_ID
        assert span.parent is not None and format(span.parent.span_id, "016x") == "00f067aa0ba902b7"
        assert span.attributes["ctrlrun.action"] == "k8s.scale"
        assert span.attributes["ctrlrun.effect_key"] == "scale:prod-eu:checkout:5"
        assert span.attributes["ctrlrun.policy_hash"].startswith("sha256:")
    assert [s.attributes["ctrlrun.outcome"] for s in spans] == ["committed", "duplicate"]
    receipts = receipts_for(sc, "scale:prod-eu:checkout:5")
    assert [r["trace_id"] for r in receipts] == [TRACE_ID, TRACE_ID]  # recorded in each receipt
