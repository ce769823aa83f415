"""``--log-format json`` writes one JSON object per line: one INFO line per decision."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from harness import KUBE_TOKEN, start_sidecar

from ctrlrun.testing import FakeKubernetes, FakeStripe


def test_json_logs_one_object_per_line_with_each_decision(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    stripe, kube = fakes
    sc = start_sidecar(tmp_path, stripe, kube, extra_args=("--log-format", "json"))
    scale = f"{sc.kube_base}/apis/apps/v1/namespaces/default/deployments/checkout/scale"
    headers = {
        "Content-Type": "application/merge-patch+json",
        "Authorization": f"Bearer {KUBE_TOKEN}",
    }
    try:
        with httpx.Client(timeout=15, trust_env=False) as client:
            assert (
                client.patch(scale, headers=headers, content=b'{"spec":{"replicas":4}}').status_code
                == 200
            )
            assert (
                client.patch(scale, headers=headers, content=b'{"spec":{"replicas":4}}').status_code
                == 403
            )
    finally:
        sc.stop()
    lines = [line for line in sc.log.read_text().splitlines() if line.strip()]
    docs = [json.loads(line) for line in lines]  # every line is a JSON object
    assert all({"ts", "level", "logger", "message"} <= set(d) for d in docs)
    messages = [d["message"] for d in docs]
    assert any("k8s.scale committed key=scale:prod-eu:checkout:4" in m for m in messages)
    assert any("refused" in m and "duplicate" in m for m in messages)
    assert KUBE_TOKEN not in sc.log.read_text()
