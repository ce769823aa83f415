"""Secrets that ride elsewhere than a request's headers: a webhook receiver's URL (Slack's and
Discord's carry their token in the path, others in the query), a ledger URL's password. None
of them reaches the proxy's log, ``/metrics``, or a command's output."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import POLICY, clean_env, free_port, start_sidecar

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(120)
PATH_TOKEN = "hookpathtoken7Qe1x9"
QUERY_TOKEN = "hookquerytoken4Lm2z8"
WEBHOOK_SECRET = "whsec_secrets2_5b7c"


class DownReceiver:
    """A webhook receiver on loopback that answers every delivery 503, and counts them."""

    def __init__(self) -> None:
        self.tries = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.tries += 1
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{port}/services/T01/B02/{PATH_TOKEN}?token={QUERY_TOKEN}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[DownReceiver]:
    r = DownReceiver()
    yield r
    r.server.shutdown()


def test_a_webhook_url_is_never_in_the_log_or_the_metrics(
    tmp_path: Path, receiver: DownReceiver
) -> None:
    hook = (
        f"notify:\n  - {{{{url: '{receiver.url}', secret_env: WEBHOOK_SECRET, format: slack}}}}\n"
    )
    with FakeStripe() as stripe, FakeKubernetes() as kube:
        sc = start_sidecar(
            tmp_path,
            stripe,
            kube,
            policy_text=POLICY + hook,
            admin=True,
            env=clean_env(WEBHOOK_SECRET=WEBHOOK_SECRET),
        )
        try:
            stripe.add_payment_intent("pi_big", 500_000)
            asked = httpx.post(
                f"{sc.stripe_base}/v1/refunds",
                data={"payment_intent": "pi_big", "amount": "150000"},
                headers={"Authorization": "Bearer sk_test_secrets2"},
                timeout=10,
            )
            assert asked.headers["X-Ctrlrun-Outcome"] == "approval_required"
            deadline = time.monotonic() + 15
            metrics = ""
            while time.monotonic() < deadline:
                metrics = httpx.get(f"{sc.admin_url}/metrics", timeout=5).text
                if receiver.tries and "ctrlrun_notify_failures_total{" in metrics:
                    break
                time.sleep(0.1)
            assert receiver.tries >= 1 and "ctrlrun_notify_failures_total{" in metrics
        finally:
            assert sc.stop() == 0
    log = sc.log.read_text()
    assert "notify: http://127.0.0.1:" in log and "retrying with backoff" in log  # it was said
    for secret in (PATH_TOKEN, QUERY_TOKEN, WEBHOOK_SECRET):
        assert secret not in log and secret not in metrics


def test_a_webhook_whose_secret_is_unset_is_refused_without_its_url(tmp_path: Path) -> None:
    url = f"https://hooks.example.com/services/T01/B02/{PATH_TOKEN}"
    policy = tmp_path / "ctrlrun.yaml"
    policy.write_text(
        "schema: ctrlrun.policy/v2\nactions: {}\n"
        f"notify:\n  - {{url: '{url}', secret_env: SECRETS2_UNSET}}\n"
        "upstreams:\n  api: {profile: http, url: 'http://127.0.0.1:9', "
        f"listen: '127.0.0.1:{free_port()}'}}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "ctrlrun.cli", "proxy", "--policy", str(policy), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=clean_env(),
    )
    assert done.returncode != 0 and "SECRETS2_UNSET" in done.stderr, done.stderr
    assert PATH_TOKEN not in done.stdout + done.stderr


PG_SERVER = "postgresql://postgres@127.0.0.1:5432"
PG_PASSWORD = "pgquerypw3Vt6"


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database (trust auth: any password is accepted), dropped after."""
    import secrets

    psycopg = pytest.importorskip("psycopg")
    name = f"ctrlrun_t_{secrets.token_hex(6)}"
    try:
        admin = psycopg.connect(f"{PG_SERVER}/test", autocommit=True, connect_timeout=3)
    except psycopg.Error:
        pytest.skip("PostgreSQL is not answering on 127.0.0.1:5432")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(f"{PG_SERVER}/test", autocommit=True, connect_timeout=3) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_ledger_password_in_the_url_query_is_never_shown(
    tmp_path: Path, pg_database: str
) -> None:
    # libpq reads ?password= (and ?sslpassword=) as it reads the one before the '@'.
    url = f"{PG_SERVER}/{pg_database}?password={PG_PASSWORD}&sslpassword={PG_PASSWORD}x"
    with FakeStripe() as stripe, FakeKubernetes() as kube:
        sc = start_sidecar(tmp_path, stripe, kube, store_url=url)
        try:
            said = [sc.start_line]
            for command in (["doctor"], ["effects"], ["stats"]):
                done = sc.cli(*command, "--store-url", url, timeout=30)
                said.append(done.stdout + done.stderr)
            gone = url.replace(pg_database, "ctrlrun_no_such_db")
            done = subprocess.run(
                [sys.executable, "-m", "ctrlrun.cli", "effects"],
                capture_output=True,
                text=True,
                timeout=30,
                cwd=tmp_path,
                env=clean_env(CTRLRUN_STORE_URL=gone),
            )
            assert done.returncode != 0
            said.append(done.stdout + done.stderr)
        finally:
            assert sc.stop() == 0
    said.append(sc.log.read_text())
    check = sc.cli("proxy", "--policy", str(sc.policy), "--check", "--store-url", url)  # ports free
    said.append(check.stdout + check.stderr)
    text = "\n".join(said)
    assert f"ledger postgresql+psycopg://postgres@127.0.0.1:5432/{pg_database}?" in text, said[-1]
    assert "password=***" in text and PG_PASSWORD not in text, text


@pytest.mark.parametrize(
    "url",
    [
        "postgresql//u:{pw}@127.0.0.1/test",  # no ':' after the scheme
        "postgresql:u:{pw}@127.0.0.1/test",
        "postgresql://u:{pw}@127.0.0.1:54x2/test",  # a port that is no number
        "postgresql://u:{pw}@[::1/test",
        "sqlite:///state.db?password={pw}",
    ],
)
def test_a_store_url_that_does_not_parse_is_one_line_without_its_password(
    tmp_path: Path, url: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ctrlrun.cli", "effects", "--store-url", url.format(pw=PG_PASSWORD)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
        env=clean_env(),
    )
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.startswith("ctrlrun: ") and done.stderr.count("\n") == 1, done.stderr
    assert PG_PASSWORD not in done.stderr


MALFORMED_KEY = "sk_test_malformed9Hq2"


def test_a_request_the_proxy_cannot_parse_is_not_echoed_into_its_log(tmp_path: Path) -> None:
    """mitmproxy says why a request is malformed (its log); never with a header's value."""
    from rawproxy import exchange

    auth = f"Authorization: Bearer {MALFORMED_KEY}\r\nProxy-Authorization: Basic {MALFORMED_KEY}"
    broken = [
        f"POST /v1/refunds HTTP/1.1\r\nHost: x\r\n{auth}\r\nBad Header: {MALFORMED_KEY}\r\n\r\n",
        f"POST /v1/refunds HTTP/1.1\r\nHost: x\r\n{auth}\r\n"
        f"Content-Length: {MALFORMED_KEY}\r\n\r\n",
        f"POST http://[{MALFORMED_KEY}/v1/refunds HTTP/1.1\r\n{auth}\r\n\r\n",
        f"CONNECT {MALFORMED_KEY}:443 HTTP/1.1\r\n{auth}\r\n\r\n",
        f"POST /v1/refunds HTTP/1.1\r\nHost: x\r\n{auth}\r\nX: a\x00{MALFORMED_KEY}\r\n\r\n",
        f"GET /?api_key={MALFORMED_KEY} HTTP/9.9\r\n{auth}\r\n\r\n",
    ]
    with FakeStripe() as stripe, FakeKubernetes() as kube:
        sc = start_sidecar(tmp_path, stripe, kube)
        try:
            answers = [exchange(sc.proxy_url, raw.encode("latin-1")) for raw in broken]
            answers += [exchange(sc.stripe_base, raw.encode("latin-1")) for raw in broken[:2]]
        finally:
            assert sc.stop() == 0
    log = sc.log.read_text()
    assert MALFORMED_KEY not in log, log
    # mitmproxy's own 400 page quotes a bad Content-Length or request line back to the client
    # that sent it; that goes nowhere else.
    statuses = [a.split(b"\r\n", 1)[0] for a in answers]
    assert all(s in (b"HTTP/1.1 400 Bad Request", b"HTTP/1.1 403 Forbidden") for s in statuses)
    # ctrlrun's own refusals (403) do not quote the request either.
    assert all(MALFORMED_KEY.encode() not in a for a in answers if b" 403 " in a[:20])
