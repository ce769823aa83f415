"""Webhooks: an approval request reaches a human's receiver, signed, within two seconds; a
receiver that is down for a while gets every event afterwards, once; the receipt names who
approved."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import POLICY, Sidecar, fake_remotes, running_sidecar

from ctrlrun.errors import PolicyError
from ctrlrun.policy import Policy
from ctrlrun.proxy.config_parse import SECTIONS
from ctrlrun.proxy.notify import NOTIFY, sign
from ctrlrun.testing import FakeStripe

SECRET = "whsec_test_0123456789"
AUTH = {"Authorization": "Bearer sk_test_notify"}


class Receiver:
    """A webhook receiver on loopback: records what it accepts; ``down`` answers 503."""

    def __init__(self) -> None:
        self.got: list[tuple[dict[str, str], bytes]] = []
        self.down = False
        self.refused = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if outer.down:
                    outer.refused += 1
                    self.send_response(503)
                else:
                    outer.got.append((dict(self.headers), body))
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def types(self) -> list[str]:
        return [json.loads(body)["type"] for _, body in self.got]

    def wait_for(self, kind: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for headers, body in self.got:
                doc = json.loads(body)
                if doc["type"] == kind:
                    verify(headers, body)
                    return dict(doc)
            time.sleep(0.05)
        raise AssertionError(f"no {kind} within {timeout} s; got {self.types()}")


def verify(headers: dict[str, str], body: bytes) -> None:
    """As a receiver verifies it (Stripe's scheme): t and v1 over "<t>.<body>"."""
    parts = dict(p.split("=", 1) for p in headers["Ctrlrun-Signature"].split(","))
    expected = hmac.new(SECRET.encode(), f"{parts['t']}.".encode() + body, hashlib.sha256)
    assert hmac.compare_digest(parts["v1"], expected.hexdigest())
    assert abs(time.time() - int(parts["t"])) < 60
    assert headers["Ctrlrun-Event-Id"] == json.loads(body)["id"]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


@pytest.fixture
def notified(tmp_path: Path, receiver: Receiver) -> Iterator[tuple[Sidecar, FakeStripe]]:
    policy = POLICY + f"notify:\n  - {{{{url: '{receiver.url}', secret_env: WEBHOOK_SECRET}}}}\n"
    env = {"WEBHOOK_SECRET": SECRET}
    with (
        fake_remotes() as (stripe, kube),
        running_sidecar(tmp_path, stripe, kube, policy_text=policy, in_process=True, env=env) as sc,
    ):
        yield sc, stripe


def big_refund(sc: Sidecar, pi: str, approval: str | None = None) -> httpx.Response:
    headers = {**AUTH, **({"Ctrlrun-Approval": approval} if approval else {})}
    data = {"payment_intent": pi, "amount": "150000"}
    return httpx.post(f"{sc.stripe_base}/v1/refunds", data=data, headers=headers, timeout=10)


def test_an_approval_reaches_the_receiver_signed_and_a_down_receiver_gets_every_event_once(
    notified: tuple[Sidecar, FakeStripe], receiver: Receiver
) -> None:
    sc, stripe = notified
    stripe.add_payment_intent("pi_big", 500_000)
    asked = time.monotonic()
    r = big_refund(sc, "pi_big")
    assert r.headers["X-Ctrlrun-Outcome"] == "approval_required"
    request_id = r.json()["ctrlrun"]["request_id"]
    requested = receiver.wait_for("approval.requested", timeout=2.0)
    assert time.monotonic() - asked < 2.0
    assert requested["approval_id"] == request_id
    assert requested["data"]["action"] == "stripe.refund"
    assert requested["data"]["arguments"]["amount"] == 150000
    assert requested["data"]["agent"] == "e2e-agent"
    assert SECRET not in json.dumps(requested) and "sk_test" not in json.dumps(requested)

    receiver.down = True
    assert (
        sc.cli("approve", request_id, "--as", "alice", "--store-url", sc.store_url).returncode == 0
    )
    deadline = time.monotonic() + 10
    while receiver.refused < 2 and time.monotonic() < deadline:  # it tried, and tried again
        time.sleep(0.05)
    assert receiver.refused >= 2
    receiver.down = False
    granted = receiver.wait_for("approval.granted", timeout=15.0)
    assert granted["approval_id"] == request_id and granted["data"]["approver"] == "alice"

    done = big_refund(sc, "pi_big", approval=request_id)
    assert done.status_code == 200, done.text
    time.sleep(1.0)  # anything sent twice would have arrived by now
    ids = [json.loads(body)["id"] for _, body in receiver.got]
    assert len(ids) == len(set(ids)) and receiver.types() == [
        "approval.requested",
        "approval.granted",
    ]
    receipts = sc.cli("receipts", "--json", "--store-url", sc.store_url).stdout
    (receipt,) = [json.loads(line) for line in receipts.splitlines() if '"committed"' in line]
    assert receipt["approver"] == "alice" and receipt["approval_id"] == request_id


V2 = "schema: ctrlrun.policy/v2\nactions: {}\n"


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("notify: {url: x}\n", "must be a list"),
        ("notify:\n  - {url: 'ftp://x', secret_env: S}\n", r"http\(s\) URL"),
        ("notify:\n  - {url: 'http://x', secret: s3cret}\n", "secret"),
        ("notify:\n  - {url: 'http://x', secret_env: S, events: [approval.lost]}\n", "approval"),
        ("notify:\n  - {url: 'http://x', secret_env: S, format: xml}\n", "format"),
    ],
)
def test_a_bad_notify_section_is_one_clear_error(section: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        Policy.from_yaml(V2 + section, sections=SECTIONS)


def test_the_signature_is_stripes_scheme() -> None:
    assert sign(b"k", b"{}", 1700000000) == (
        "t=1700000000,v1=" + hmac.new(b"k", b"1700000000.{}", hashlib.sha256).hexdigest()
    )
    hooks = Policy.from_yaml(
        V2 + "notify:\n  - {url: 'https://h.test/x', secret_env: S, format: slack}\n",
        sections=SECTIONS,
    ).section(NOTIFY)
    assert hooks[0].format == "slack" and "approval.requested" in hooks[0].events


def test_a_request_nobody_answers_is_told_expired_when_its_time_is_up(
    tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ctrlrun.proxy.server as server

    monkeypatch.setattr(server, "EXPIRE_INTERVAL", 0.2)
    policy = POLICY + f"notify:\n  - {{{{url: '{receiver.url}', secret_env: WEBHOOK_SECRET}}}}\n"
    env = {"WEBHOOK_SECRET": SECRET}
    with (
        fake_remotes() as (stripe, kube),
        running_sidecar(tmp_path, stripe, kube, policy_text=policy, in_process=True, env=env) as sc,
    ):
        stripe.add_payment_intent("pi_late", 500_000)
        request_id = big_refund(sc, "pi_late").json()["ctrlrun"]["request_id"]
        receiver.wait_for("approval.requested", timeout=2.0)
        store = sc.store()
        with store.transaction() as conn:  # its fifteen minutes, passed
            conn.exec_driver_sql(
                "UPDATE approvals SET expires_at = '2000-01-01T00:00:00.000000Z' "
                "WHERE approval_id = ?",
                (request_id,),
            )
        store.close()
        expired = receiver.wait_for("approval.expired", timeout=5.0)
        assert expired["approval_id"] == request_id
        listed = sc.cli("approvals", "--store-url", sc.store_url).stdout
        assert request_id not in listed  # no longer offered to anybody
        late = sc.cli("approve", request_id, "--as", "alice", "--store-url", sc.store_url)
        assert late.returncode == 1 and "expired" in late.stderr
        time.sleep(0.6)  # a few more rounds: it is told once
        assert receiver.types().count("approval.expired") == 1
