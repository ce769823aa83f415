"""Credentials never land anywhere: after real traffic through ``ctrlrun proxy`` (commits,
duplicates, lost replies reconciled with the request's own credentials, refusals, approvals,
per-agent proxy tokens), no secret is in the ledger, the receipts, the events, the log or
the proxy's stdout."""

from __future__ import annotations

import base64
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness import KUBE_TOKEN, POLICY, STRIPE_KEY, Sidecar, clean_env, running_sidecar
from stripe_support import CLIENT_TIMEOUT, outcome, refund, refused, stripe_client

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(180)
AGENT = "refund-agent"
PROXY_TOKEN = "proxy-e2e-token-5d1e8b"
WRONG_TOKEN = "proxy-e2e-wrong-9c04aa"
SCALE = "/apis/apps/v1/namespaces/default/deployments/checkout/scale"
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}


def basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


SECRETS = {
    "stripe api key": STRIPE_KEY,
    "kubernetes bearer token": KUBE_TOKEN,
    "proxy token": PROXY_TOKEN,
    "wrong proxy token": WRONG_TOKEN,
    "proxy credential (base64)": basic(AGENT, PROXY_TOKEN),
    "wrong proxy credential (base64)": basic(AGENT, WRONG_TOKEN),
}


@pytest.fixture
def used(tmp_path: Path) -> Iterator[tuple[Sidecar, FakeStripe, FakeKubernetes]]:
    """A sidecar with per-agent proxy tokens and eager reconcilers; stopped by the test."""
    text = POLICY + f"agents:\n  {AGENT}: {{{{token_env: E2E_PROXY_TOKEN}}}}\n"
    with FakeStripe() as fake, FakeKubernetes() as kube:
        kube.add_deployment(namespace="default", name="checkout", replicas=3)
        with running_sidecar(
            tmp_path / "sidecar",
            fake,
            kube,
            policy_text=text,
            reconcile="eager",
            env=clean_env(E2E_PROXY_TOKEN=PROXY_TOKEN),
        ) as sc:
            yield sc, fake, kube


def drive_stripe(sc: Sidecar, fake: FakeStripe) -> None:
    """Every Stripe path that handles the API key: forwarded, refused, reconciled."""
    # With agents: listed, only a valid token names the agent, even beside --principal.
    host = sc.proxy_url.removeprefix("http://")
    client = stripe_client(fake.url, proxy=f"http://{AGENT}:{PROXY_TOKEN}@{host}")
    pi = fake.add_payment_intent(amount=500_000)["id"]
    refund(client, pi, 1000)
    assert outcome(refused(lambda: refund(client, pi, 1000))) == "duplicate"

    lost = fake.add_payment_intent(amount=5000)["id"]
    fake.fail_next("commit_then_drop")  # the reconciler asks Stripe with the request's key
    assert outcome(refused(lambda: refund(client, lost, 1000))) == "upstream_ambiguous"
    assert sc.effect_state(f"refund:{lost}") == "committed"

    bad = fake.add_payment_intent(amount=5000)["id"]
    fake.fail_next(400)
    assert refused(lambda: refund(client, bad, 1000)).http_status == 400
    fake.fail_next(500)
    assert outcome(refused(lambda: refund(client, bad, 1000))) == "upstream_ambiguous"

    payout = {"amount": 1, "currency": "usd"}
    assert outcome(refused(lambda: client.v1.payouts.create(params=payout))) == "denied"
    big = fake.add_payment_intent(amount=500_000)["id"]
    asked = refused(lambda: refund(client, big, 200_000))
    request_id = (asked.json_body or {})["ctrlrun"]["request_id"]
    assert sc.cli("approve", request_id, "--store-url", sc.store_url).returncode == 0
    refund(client, big, 200_000, headers={"Ctrlrun-Approval": request_id})

    auth = {
        "Authorization": f"Bearer {STRIPE_KEY}",
        "Proxy-Authorization": f"Basic {basic(AGENT, PROXY_TOKEN)}",
    }
    with httpx.Client(base_url=sc.stripe_base, timeout=CLIENT_TIMEOUT, trust_env=False) as http:
        floaty = http.post(
            "/v1/refunds", data={"payment_intent": pi, "amount": "1.5"}, headers=auth
        )
        assert (
            floaty.status_code == 400 and floaty.json()["ctrlrun"]["outcome"] == "invalid_request"
        )
        # A key in the body of an unparseable request is not echoed anywhere either.
        junk = http.post(
            "/v1/refunds",
            content=f"{STRIPE_KEY}=%ZZ".encode(),
            headers={**auth, "Content-Type": "application/x-www-form-urlencoded"},
        )
        assert junk.status_code == 400


def drive_proxy_tokens(sc: Sidecar, fake: FakeStripe) -> None:
    """Through the explicit proxy with a per-agent token, and with a wrong one."""
    host = sc.proxy_url.removeprefix("http://")
    pi = fake.add_payment_intent(amount=5000)["id"]
    agent = stripe_client(fake.url, proxy=f"http://{AGENT}:{PROXY_TOKEN}@{host}")
    refund(agent, pi, 1000)

    other = fake.add_payment_intent(amount=5000)["id"]
    wrong = stripe_client(fake.url, proxy=f"http://{AGENT}:{WRONG_TOKEN}@{host}")
    err = refused(lambda: refund(wrong, other, 1000))
    assert outcome(err) == "denied" and (err.json_body or {})["ctrlrun"]["reason"] == "no_principal"


def drive_kubernetes(sc: Sidecar, kube: FakeKubernetes) -> None:
    headers = {
        "Authorization": f"Bearer {KUBE_TOKEN}",
        "Proxy-Authorization": f"Basic {basic(AGENT, PROXY_TOKEN)}",
        **MERGE_PATCH,
    }
    with httpx.Client(base_url=sc.kube_base, timeout=CLIENT_TIMEOUT, trust_env=False) as http:
        assert http.patch(SCALE, json={"spec": {"replicas": 5}}, headers=headers).status_code == 200
        kube.fail_next("commit_then_drop")  # the reconciler reads back with the request's token
        lost = http.patch(SCALE, json={"spec": {"replicas": 7}}, headers=headers)
        assert lost.status_code == 504, lost.text
    assert sc.effect_state("scale:prod-eu:checkout:7") == "committed"


def sqlite_dump(path: Path) -> str:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        assert {"effects", "events", "receipts", "approvals"} <= set(tables), tables
        return "\n".join(conn.iterdump())
    finally:
        conn.close()


def test_no_secret_is_kept_anywhere(
    used: tuple[Sidecar, FakeStripe, FakeKubernetes],
) -> None:
    sc, fake, kube = used
    drive_stripe(sc, fake)
    drive_proxy_tokens(sc, fake)
    drive_kubernetes(sc, kube)

    assert sc.stop() == 0
    assert sc.proc is not None and sc.proc.stdout is not None
    places = {
        "proxy stdout": sc.start_line + "\n" + sc.proc.stdout.read(),
        "proxy log": sc.log.read_text(),
        "database dump": sqlite_dump(sc.workdir / "state.db"),
    }
    for command in (["receipts", "--json"], ["effects", "--json"], ["approvals"], ["stats"]):
        done = sc.cli(*command, "--store-url", sc.store_url, timeout=30)
        assert done.returncode == 0, done.stderr
        places[f"ctrlrun {command[0]}"] = done.stdout + done.stderr
    # And every byte the sidecar left on disk (free pages and the WAL included).
    for path in sorted(p for p in sc.workdir.rglob("*") if p.is_file()):
        places[f"file {path.relative_to(sc.workdir)}"] = path.read_bytes().decode("latin-1")

    # The places hold what happened (so an empty dump cannot pass) ...
    assert (
        "refund-agent" in places["database dump"]
        and "scale:prod-eu:checkout:7" in places["ctrlrun receipts"]
    )
    assert "RECONCILIATION_RESOLVED" in places["ctrlrun receipts"]
    assert "committed" in places["proxy log"]
    # ... and none of the credentials that came with it.
    leaks = [
        f"{what} in {where}"
        for where, text in places.items()
        for what, secret in SECRETS.items()
        if secret in text
    ]
    assert leaks == []
