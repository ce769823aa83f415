"""An argument the policy compares as a number is read as the number the server reads.

Forms and queries carry text: ``amount=900000`` is "900000". The kernel's comparison of text
with a number is false, so a policy written as "deny above 1000, otherwise allow" let a form's
900000 through to a server that reads 900000. Through a real sidecar to a recording server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness import Sidecar, fake_remotes, running_sidecar
from rawproxy import Recorder

pytestmark = pytest.mark.timeout(120)

# Formatted by the harness: braces are doubled.
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  billing.charge:
    rules:
      - when: {{amount_gt: 1000}}
        decision: deny
      - decision: allow
upstreams:
  billing:
    profile: http
    url: http://127.0.0.1:PORT
    routes:
      - {{method: POST, path: "/v1/charges", action: billing.charge}}
      - {{method: POST, path: "/v1/charges/{{amount}}", action: billing.charge}}
"""
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[Sidecar, Recorder]]:
    with Recorder() as billing, fake_remotes() as (stripe, kube):
        policy = POLICY.replace("PORT", str(billing.port))
        with running_sidecar(tmp_path, stripe, kube, policy_text=policy, in_process=True) as sc:
            yield sc, billing


@pytest.mark.parametrize(
    ("path", "headers", "body"),
    [
        ("/v1/charges", FORM, b"amount=900000"),
        ("/v1/charges?amount=900000", FORM, b""),
        ("/v1/charges/900000", FORM, b""),
        ("/v1/charges", JSON, b'{"amount": "900000"}'),
    ],
)
def test_text_spelling_a_large_amount_is_judged_as_that_amount(
    rig: tuple[Sidecar, Recorder], path: str, headers: dict[str, str], body: bytes
) -> None:
    sc, billing = rig
    with httpx.Client(proxy=sc.proxy_url, trust_env=False, timeout=30) as http:
        url = f"http://127.0.0.1:{billing.port}"
        got = http.post(url + path, content=body, headers=headers)
        assert got.headers["x-ctrlrun-outcome"] == "denied", got.text
        assert billing.seen == []
        small = http.post(url + "/v1/charges", content=b"amount=700", headers=FORM)
        assert small.status_code == 200, small.text
    assert len(billing.seen) == 1


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        (FORM, b"amount=0900000"),  # some servers read it as 900000, some as octal
        (FORM, b"amount=9e5"),
        (FORM, b"amount=%2B900000"),
        (FORM, b"note=no+amount"),  # none at all: the policy cannot decide it
        (JSON, b'{"amount": true}'),
        (JSON, b'{"amount": " 900000"}'),
    ],
)
def test_an_amount_the_policy_cannot_read_as_an_integer_is_refused(
    rig: tuple[Sidecar, Recorder], headers: dict[str, str], body: bytes
) -> None:
    sc, billing = rig
    with httpx.Client(proxy=sc.proxy_url, trust_env=False, timeout=30) as http:
        url = f"http://127.0.0.1:{billing.port}/v1/charges"
        got = http.post(url, content=body, headers=headers)
    assert got.headers["x-ctrlrun-outcome"] == "invalid_request", got.text
    assert "number_required" in got.text and "give amount as an integer" in got.text
    assert billing.seen == []
