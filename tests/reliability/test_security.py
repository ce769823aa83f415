"""Security properties of a running sidecar and of its ledger.

Loopback-only listeners by default; the CA's private key readable by its owner only; no
credential anywhere the sidecar writes (tables, receipts, events, log, stdout, CLI output);
and ``ctrlrun receipts --verify-chain`` catching every kind of tampering, on both engines.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from e2e.harness import POLICY, Sidecar, clean_env, free_port
from sqlalchemy import Connection, text

from ctrlrun.action import Action, Principal, canonical_bytes, sha256
from ctrlrun.cli import main as cli_main
from ctrlrun.control import Control
from ctrlrun.policy import Policy
from ctrlrun.store import open_store
from ctrlrun.testing import FakeKubernetes, FakeStripe

STRIPE_SECRET = "sk_test_RELsecretStripe7781"
KUBE_SECRET = "kube-REL-secret-token-4410"
PROXY_TOKEN = "proxy-REL-secret-9d2c"
WRONG_TOKEN = "proxy-REL-wrong-77aa"
COOKIE_SECRET = "sid-REL-cookie-5e1f"
API_KEY_SECRET = "apikey-REL-header-0c3b"
AGENT = "refund-agent"


def basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


SECRETS = [
    STRIPE_SECRET,
    KUBE_SECRET,
    PROXY_TOKEN,
    WRONG_TOKEN,
    COOKIE_SECRET,
    API_KEY_SECRET,
    basic(AGENT, PROXY_TOKEN),
    basic(AGENT, WRONG_TOKEN),
]


# -- listeners and the CA key ----------------------------------------------------------------


def listening(pid: int) -> list[str]:
    """Local addresses of the TCP listeners of process ``pid`` (from ``ss``)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=10).stdout
    return [line.split()[3] for line in out.splitlines() if f"pid={pid}," in line]


@pytest.mark.skipif(shutil.which("ss") is None, reason="ss (iproute2) is not installed")
def test_default_listeners_are_loopback_and_ca_key_is_private(tmp_path: Path) -> None:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", 8080))
        except OSError:
            pytest.skip("127.0.0.1:8080 (the default --listen) is taken on this machine")
    policy = tmp_path / "ctrlrun.yaml"
    policy.write_text(
        POLICY.format(
            stripe="http://127.0.0.1:9",
            kube="http://127.0.0.1:10",
            stripe_port=free_port(),
            kube_port=free_port(),
            timeout=5,
            reconcile="off",
        )
    )
    confdir = tmp_path / "mitm"
    log = (tmp_path / "proxy.log").open("w")
    # No --listen: the default. --admin has no default; given with port 0 it binds as told.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ctrlrun.cli",
            "proxy",
            "--policy",
            str(policy),
            "--principal",
            "sec",
            "--store-url",
            f"sqlite:///{tmp_path / 'state.db'}",
            "--confdir",
            str(confdir),
            "--admin",
            "127.0.0.1:0",
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening" not in line:
            proc.wait(timeout=30)
            log.flush()
            output = (tmp_path / "proxy.log").read_text()
            if "cannot listen on 127.0.0.1:8080" in output:
                pytest.skip("127.0.0.1:8080 was taken while the proxy started")
            raise AssertionError(output[-2000:])
        announced = re.findall(r"(?:proxy|stripe|cluster|admin) (\[?[\w.:]+\]?:\d+)", line)
        bound: list[str] = []
        for _ in range(50):
            bound = listening(proc.pid)
            if len(bound) >= len(announced):
                break
            time.sleep(0.1)
        print(f"start-up line: {line.strip()}")
        print(f"bound: {sorted(bound)}")
        assert "proxy 127.0.0.1:8080" in line
        assert len(announced) == 4  # proxy, two reverse listeners, admin
        assert sorted(bound) == sorted(announced)
        assert all(addr.startswith(("127.0.0.1:", "[::1]:")) for addr in bound)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    key_files = [p for p in confdir.iterdir() if p.name.startswith("mitmproxy-ca.")]
    assert {p.name for p in key_files} >= {"mitmproxy-ca.pem"}
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in key_files}
    print(f"CA key files: {modes}; confdir {oct(stat.S_IMODE(confdir.stat().st_mode))}")
    assert set(modes.values()) == {"0o600"}
    assert "PRIVATE KEY" in (confdir / "mitmproxy-ca.pem").read_text()
    assert stat.S_IMODE(confdir.stat().st_mode) & 0o077 == 0


# -- no credential anywhere -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_no_credential_lands_anywhere(
    fakes: tuple[FakeStripe, FakeKubernetes], sidecars: Callable[..., Sidecar]
) -> None:
    stripe, kube = fakes
    kube.add_deployment("default", "checkout", replicas=3)
    text = POLICY + f"agents:\n  {AGENT}: {{{{token_env: REL_PROXY_TOKEN}}}}\n"
    sc = sidecars(stripe, kube, policy_text=text, env=clean_env(REL_PROXY_TOKEN=PROXY_TOKEN))
    sent: list[str] = []
    stripe_headers = {
        "Authorization": f"Bearer {STRIPE_SECRET}",
        "Cookie": f"sid={COOKIE_SECRET}",
        "X-Api-Key": API_KEY_SECRET,
        "Proxy-Authorization": f"Basic {basic(AGENT, PROXY_TOKEN)}",
    }
    kube_headers = {
        "Authorization": f"Bearer {KUBE_SECRET}",
        "Proxy-Authorization": f"Basic {basic(AGENT, PROXY_TOKEN)}",
        "Content-Type": "application/merge-patch+json",
    }
    with (
        httpx.Client(base_url=sc.stripe_base, timeout=60, trust_env=False) as s,
        httpx.Client(base_url=sc.kube_base, timeout=60, trust_env=False) as k,
    ):

        def refund(
            amount: int, *, headers: dict[str, str] = stripe_headers, arm: str | int | None = None
        ) -> None:
            pi = stripe.add_payment_intent(amount=500_000)["id"]
            if arm is not None:
                stripe.fail_next(arm)
            r = s.post(
                "/v1/refunds", data={"payment_intent": pi, "amount": str(amount)}, headers=headers
            )
            sent.append(f"refund:{r.status_code}:{r.headers.get('x-ctrlrun-outcome', '-')}")
            if arm is None and r.status_code == 200:  # and once more: a duplicate
                again = s.post(
                    "/v1/refunds",
                    data={"payment_intent": pi, "amount": str(amount)},
                    headers=headers,
                )
                sent.append(f"again:{again.headers.get('x-ctrlrun-outcome', '-')}")

        refund(100)
        refund(200, arm=500)  # ambiguous: the eager reconciler uses the request's own key
        refund(300, arm="commit_then_drop")
        refund(400, arm=402)
        refund(200_000)  # approval required
        refund(
            500,
            headers={**stripe_headers, "Proxy-Authorization": f"Basic {basic(AGENT, WRONG_TOKEN)}"},
        )
        r = s.post("/v1/customers", data={"email": "a@example.com"}, headers=stripe_headers)
        sent.append(f"unmapped:{r.headers.get('x-ctrlrun-outcome', '-')}")
        for replicas, arm in ((4, None), (5, 503), (6, "commit_then_drop")):
            if arm is not None:
                kube.fail_next(arm)
            r = k.patch(
                "/apis/apps/v1/namespaces/default/deployments/checkout/scale",
                content=b'{"spec":{"replicas":%d}}' % replicas,
                headers=kube_headers,
            )
            sent.append(f"scale:{r.status_code}:{r.headers.get('x-ctrlrun-outcome', '-')}")
    # Through the explicit proxy, with the agent's credential in the proxy URL.
    proxy_url = sc.proxy_url.replace("http://", f"http://{AGENT}:{PROXY_TOKEN}@")
    with httpx.Client(proxy=proxy_url, timeout=60, trust_env=False) as via:
        pi = stripe.add_payment_intent(amount=5000)["id"]
        r = via.post(
            f"{stripe.url}/v1/refunds",
            data={"payment_intent": pi, "amount": "100"},
            headers={"Authorization": f"Bearer {STRIPE_SECRET}"},
        )
        sent.append(f"via-proxy:{r.status_code}")
    cli = [
        CliRunner().invoke(cli_main, [*args, "--store-url", sc.store_url])
        for args in (["receipts", "--json"], ["effects", "--json"], ["stats"])
    ]
    assert sc.stop() == 0

    db = sqlite3.connect(sc.store_url.removeprefix("sqlite:///"))
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    rows = {
        t: [" ".join(map(str, row)) for row in db.execute(f'SELECT * FROM "{t}"')] for t in tables
    }
    db.close()
    places = {f"table {t}": "\n".join(v) for t, v in rows.items()}
    places["log"] = sc.log.read_text()
    places["stdout"] = sc.start_line
    places["cli"] = "\n".join(c.output for c in cli)
    found = {
        (where, secret)
        for where, content in places.items()
        for secret in SECRETS
        if secret in content
    }
    print(
        f"traffic: {sent}; rows: { {t: len(v) for t, v in rows.items()} }; "
        f"log lines: {len(places['log'].splitlines())}; credentials found: {len(found)}"
    )
    assert not found, found
    assert len(rows["receipts"]) >= 9 and len(rows["events"]) >= 40  # there was real traffic
    assert "refund:200:-" in sent and "scale:200:-" in sent and "via-proxy:200" in sent


# -- tampering with the receipt chain ---------------------------------------------------------


def rehash(conn: Connection) -> None:
    """Alter receipt 3 and give it a matching hash: only the link from receipt 4 can tell."""
    body = conn.execute(text("SELECT json FROM receipts WHERE seq = 3")).scalar_one()
    doc = json.loads(body)
    doc["arguments"] = {"i": 33}
    new_body = canonical_bytes(doc).decode()
    conn.execute(
        text("UPDATE receipts SET json = :b, hash = :h WHERE seq = 3"),
        {"b": new_body, "h": sha256(new_body.encode())},
    )


def alter(conn: Connection) -> None:
    conn.execute(
        text("UPDATE receipts SET json = replace(json, :old, :new) WHERE seq = 3"),
        {"old": '"i":3', "new": '"i":33'},
    )


def run_sql(*statements: str) -> Callable[[Connection], None]:
    def tamper(conn: Connection) -> None:
        for sql in statements:
            conn.execute(text(sql))

    return tamper


TAMPERING: dict[str, tuple[Callable[[Connection], None], str]] = {
    # name: (what the attacker does, the break verify-chain must name)
    "alter": (alter, "content altered"),
    "alter and rehash": (rehash, "link broken"),
    "delete middle": (run_sql("DELETE FROM receipts WHERE seq = 3"), "missing"),
    "reorder": (
        run_sql(
            "UPDATE receipts SET seq = -1 WHERE seq = 2",
            "UPDATE receipts SET seq = 2 WHERE seq = 4",
            "UPDATE receipts SET seq = 4 WHERE seq = -1",
        ),
        "reordered",
    ),
    "truncate tail": (run_sql("DELETE FROM receipts WHERE seq >= 5"), "head mismatch"),
}


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
@pytest.mark.parametrize("tamper", list(TAMPERING))
def test_verify_chain_detects_tampering(
    engine: str, tamper: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = (
        f"sqlite:///{tmp_path / 'state.db'}"
        if engine == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    store = open_store(url)
    try:
        control = Control(
            Policy.from_yaml("schema: ctrlrun.policy/v2\nactions:\n  note:\n    decision: allow\n"),
            store,
        )
        for i in range(1, 7):
            control.execute(Action("note", {"i": i}, Principal("tamper-test")), lambda: None)
        intact = CliRunner().invoke(cli_main, ["receipts", "--verify-chain", "--store-url", url])
        assert intact.exit_code == 0 and "chain intact" in intact.output
        attack, expected = TAMPERING[tamper]
        with store.transaction() as conn:
            attack(conn)
    finally:
        store.close()
    broken = CliRunner().invoke(cli_main, ["receipts", "--verify-chain", "--store-url", url])
    names = re.findall(r"^seq -?\d+: ([a-z ]+):", broken.output, re.M)
    print(f"{engine} {tamper}: exit {broken.exit_code}, breaks {names}")
    assert broken.exit_code == 1, broken.output
    assert expected in names, broken.output
