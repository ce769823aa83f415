"""Attacks on Stripe refunds through the sidecar, with the official client: one connected
account reached two ways (the platform's key with ``Stripe-Account``, the account's own key
without) is one account, so one payment is one effect whichever credential refunds it."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import closing
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from harness import POLICY, STRIPE_KEY, Sidecar, running_sidecar
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_support import receipt_meta, start_mcp_sidecar
from sqlalchemy import update
from stripe_support import outcome, refused
from stripe_support import stripe_client as client_for

from ctrlrun.action import iso, utc_now
from ctrlrun.proxy.stripe_accounts import AccountBook
from ctrlrun.schema import effects
from ctrlrun.testing import FakeKubernetes, FakeStripe
from ctrlrun.testing.stripe_mcp import FakeStripeMcp

pytestmark = pytest.mark.timeout(120)
OWN_KEY = "sk_test_acctA_own_key_77"  # acct_A's own secret key
ACCOUNT_POLICY = POLICY.replace(
    '    effect: "refund:{{payment_id}}"\n', '    effect: "refund:{{account}}:{{payment_id}}"\n'
)
assert ACCOUNT_POLICY != POLICY


@pytest.fixture(scope="module")
def remotes() -> Iterator[tuple[FakeStripe, FakeKubernetes]]:
    with FakeStripe() as fake, FakeKubernetes() as kube:
        fake.add_account("acct_A", key=OWN_KEY)
        fake.add_account("acct_B")
        yield fake, kube


@pytest.fixture
def fake(remotes: tuple[FakeStripe, FakeKubernetes]) -> FakeStripe:
    remotes[0].fail_next(None)
    remotes[0].fail_reads(None)
    return remotes[0]


@pytest.fixture
def sc(tmp_path: Path, remotes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[Sidecar]:
    with running_sidecar(
        tmp_path, *remotes, policy_text=ACCOUNT_POLICY, reconcile="off", in_process=True
    ) as sidecar:
        yield sidecar


def refund(sc: Sidecar, pi: str, *, key: str = STRIPE_KEY, account: str | None = None) -> Any:
    options: dict[str, Any] = {"stripe_account": account} if account else {}
    params = {"payment_intent": pi, "amount": 100}
    client = client_for(sc.stripe_base, api_key=key, retries=0)
    return client.v1.refunds.create(params=params, options=options)  # type: ignore[arg-type]


def test_the_fake_answers_each_keys_own_account(fake: FakeStripe) -> None:
    def account(key: str, header: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} | (
            {"Stripe-Account": header} if header else {}
        )
        return httpx.get(f"{fake.url}/v1/account", headers=headers, timeout=5, trust_env=False)

    assert account(STRIPE_KEY).json()["id"] == fake.platform_id
    assert account(STRIPE_KEY, "acct_A").json()["id"] == "acct_A"
    assert account(STRIPE_KEY, fake.platform_id).json()["id"] == fake.platform_id
    assert account(OWN_KEY).json()["id"] == "acct_A"
    assert account(OWN_KEY, "acct_A").json()["id"] == "acct_A"
    assert account(OWN_KEY, "acct_B").status_code == 403  # not a platform: no other account
    assert account("sk_live_nope").status_code == 401


@pytest.mark.parametrize("first", ["platform", "own"])
def test_one_connected_account_reached_two_ways_refunds_once(
    sc: Sidecar, fake: FakeStripe, first: str
) -> None:
    pi = fake.add_payment_intent(amount=5000, account="acct_A")["id"]
    ways = {
        "platform": lambda: refund(sc, pi, account="acct_A"),
        "own": lambda: refund(sc, pi, key=OWN_KEY),
    }
    second = "own" if first == "platform" else "platform"

    assert ways[first]().amount == 100
    again = refused(ways[second])

    assert again.http_status == 409 and outcome(again) == "duplicate"
    assert [r["payment_intent"] for r in fake.refunds_in("acct_A")].count(pi) == 1
    assert sc.effect_state(f"refund:acct_A:{pi}") == "committed"
    assert sc.effect_state(f"refund:self:{pi}") is None


def test_the_platform_named_by_its_own_id_is_the_platform(sc: Sidecar, fake: FakeStripe) -> None:
    pi = fake.add_payment_intent(amount=5000)["id"]

    assert refund(sc, pi).amount == 100
    again = refused(lambda: refund(sc, pi, account=fake.platform_id))

    assert again.http_status == 409 and outcome(again) == "duplicate"
    assert len([r for r in fake.refunds if r["payment_intent"] == pi]) == 1
    assert sc.effect_state(f"refund:{fake.platform_id}:{pi}") == "committed"


def test_a_keys_account_is_asked_once(sc: Sidecar, fake: FakeStripe) -> None:
    pis = [fake.add_payment_intent(amount=5000, account="acct_A")["id"] for _ in range(3)]
    asked = fake.count("GET", "/v1/account")

    for pi in pis:
        assert refund(sc, pi, key=OWN_KEY).amount == 100

    assert fake.count("GET", "/v1/account") - asked == 1
    for pi in pis:
        assert sc.effect_state(f"refund:acct_A:{pi}") == "committed"


def test_a_key_stripe_will_not_name_an_account_for_refunds_nothing(
    sc: Sidecar, fake: FakeStripe
) -> None:
    pi = fake.add_payment_intent(amount=5000)["id"]
    posts = fake.count("POST")

    bad_key = refused(lambda: refund(sc, pi, key="sk_live_not_this_fake"))
    fake.fail_reads(503, path="/v1/account")
    down = refused(lambda: refund(sc, pi, key="sk_test_fresh_key_never_seen"))
    fake.fail_reads(None)

    assert bad_key.http_status == 400 and outcome(bad_key) == "invalid_request"
    assert "GET /v1/account" in str(bad_key.user_message)
    assert down.http_status == 503 and outcome(down) == "unavailable"
    assert fake.count("POST") == posts  # nothing forwarded


def test_a_refund_through_rest_refuses_it_through_mcp_with_the_other_credential(
    tmp_path: Path, remotes: tuple[FakeStripe, FakeKubernetes], fake: FakeStripe
) -> None:
    pi = fake.add_payment_intent(amount=5000, account="acct_A")["id"]
    with FakeStripeMcp(fake, json_response=True) as server:
        sc = start_mcp_sidecar(tmp_path, *remotes, server, reconcile="off")
        try:
            assert refund(sc, pi, account="acct_A").amount == 100

            async def agent() -> Any:
                auth = {"Authorization": f"Bearer {OWN_KEY}"}  # acct_A's own key, no header
                http = httpx.AsyncClient(
                    headers=auth, timeout=30, proxy=sc.proxy_url, trust_env=False
                )
                async with (
                    http,
                    streamable_http_client(server.url, http_client=http) as (r, w, _),
                    ClientSession(r, w) as session,
                ):
                    await session.initialize()
                    args = {"payment_intent": pi, "amount": 100}
                    return await session.call_tool("create_refund", args)

            again = asyncio.run(agent())
        finally:
            sc.stop()

    assert again.isError and receipt_meta(again)["outcome"] == "duplicate"
    assert receipt_meta(again)["effect_key"] == f"refund:acct_A:{pi}"
    assert [r["payment_intent"] for r in fake.refunds_in("acct_A")].count(pi) == 1


def test_the_book_keeps_no_key_and_forgets_the_oldest() -> None:
    book = AccountBook(size=2)
    for n in range(3):
        book.remember("stripe", f"Bearer sk_test_key{n}", f"acct_{n}")

    assert book.recall("stripe", "Bearer sk_test_key0") is None
    assert book.recall("stripe", "Bearer sk_test_key2") == "acct_2"
    assert book.recall("other", "Bearer sk_test_key2") is None
    assert book.recall("stripe", "Basic sk_test_key2") is None  # another spelling: asked again
    assert "sk_test_key" not in repr(vars(book))


@pytest.mark.parametrize(("key", "account", "applied", "found"), [
    (OWN_KEY, "acct_A", True, "unknown"),  # the platform's key cannot see acct_A's refund
    (OWN_KEY, "acct_A", False, "unknown"),  # nor its absence
    (STRIPE_KEY, None, False, "not_executed"),  # the platform's payment, asked of the platform
])  # fmt: skip
def test_a_sweep_with_the_upstreams_key_proves_nothing_of_another_keys_account(
    tmp_path: Path,
    remotes: tuple[FakeStripe, FakeKubernetes],
    fake: FakeStripe,
    key: str,
    account: str | None,
    applied: bool,
    found: str,
) -> None:
    # A policy that does not read account: the refund with acct_A's own key is "self"; after a
    # restart only the upstream's api_key_env (the platform's key) is there to ask with.
    pi = fake.add_payment_intent(amount=5000, account=account)["id"]
    with running_sidecar(tmp_path, *remotes, reconcile="lazy") as sc:
        fake.fail_next("commit_then_drop" if applied else "reset_before")
        lost = refused(lambda: refund(sc, pi, key=key))
        assert lost.http_status == 504 and outcome(lost) == "upstream_ambiguous"
    assert len([r for r in fake.refunds_in(account) if r["payment_intent"] == pi]) == applied
    effect_key = f"refund:{pi}"
    past = iso(utc_now() - timedelta(seconds=300))  # the settle window is long over
    store = sc.store()
    try:
        with store.transaction() as conn:
            conn.execute(
                update(effects)
                .where(effects.c.effect_key == effect_key)
                .values(attempt_started_at=past, updated_at=past, lease_expires_at=past)
            )
    finally:
        store.close()

    asked = sc.cli("reconcile", effect_key, "--store-url", sc.store_url, "--policy", str(sc.policy))

    assert asked.returncode == 0 and asked.stdout.split() == [effect_key, found], asked
    assert sc.effect_state(effect_key) == ("failed" if found == "not_executed" else "ambiguous")


def test_the_own_key_spelt_as_basic_auth_is_the_same_account(sc: Sidecar, fake: FakeStripe) -> None:
    pi = fake.add_payment_intent(amount=5000, account="acct_A")["id"]
    assert refund(sc, pi, account="acct_A").amount == 100

    basic = httpx.post(
        f"{sc.stripe_base}/v1/refunds",
        data={"payment_intent": pi, "amount": "100"},
        auth=(OWN_KEY, ""),
        timeout=15,
        trust_env=False,
    )

    assert basic.status_code == 409, basic.text
    assert basic.headers["X-Ctrlrun-Outcome"] == "duplicate"
    assert [r["payment_intent"] for r in fake.refunds_in("acct_A")].count(pi) == 1


def test_the_legacy_charge_refund_with_the_own_key_is_the_same_refund(
    sc: Sidecar, fake: FakeStripe
) -> None:
    paid = fake.add_payment_intent(amount=5000, account="acct_A")
    assert refund(sc, paid["id"], account="acct_A").amount == 100

    legacy = httpx.post(
        f"{sc.stripe_base}/v1/charges/{paid['latest_charge']}/refund",
        data={"amount": "100"},
        headers={"Authorization": f"Bearer {OWN_KEY}"},
        timeout=15,
        trust_env=False,
    )

    assert legacy.status_code == 409 and legacy.headers["X-Ctrlrun-Outcome"] == "duplicate"
    assert [r["payment_intent"] for r in fake.refunds_in("acct_A")].count(paid["id"]) == 1


class _NoAccounts:
    """A server that speaks Stripe's refunds but serves no ``GET /v1/account`` (a mock)."""

    def __init__(self, status: int = 404) -> None:
        posts: list[str] = []
        self.posts = posts

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                posts.append(self.path)
                pi = dict(urllib.parse.parse_qsl(body.decode()))["payment_intent"]
                refund = {"id": f"re_{len(posts)}", "object": "refund", "amount": 100}
                refund |= {"payment_intent": pi, "status": "succeeded", "currency": "usd"}
                self._answer(200, refund)

            def do_GET(self) -> None:
                error = {"type": "invalid_request_error", "message": "Unrecognized request URL"}
                self._answer(status, {"error": error})

            def _answer(self, status: int, document: dict[str, Any]) -> None:
                data = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_remote_without_the_account_endpoint_keys_writes_as_self(
    tmp_path: Path, remotes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    mock = _NoAccounts()
    with (
        closing(mock),
        running_sidecar(
            tmp_path,
            cast(FakeStripe, mock),  # only its url is read
            remotes[1],
            policy_text=ACCOUNT_POLICY,
            reconcile="off",
            in_process=True,
        ) as sidecar,
    ):
        assert refund(sidecar, "pi_mock_1").amount == 100
        again = refused(lambda: refund(sidecar, "pi_mock_1"))
        assert again.http_status == 409 and outcome(again) == "duplicate"
        assert sidecar.effect_state("refund:self:pi_mock_1") == "committed"
        assert mock.posts == ["/v1/refunds"]


def test_a_rate_limited_account_question_refuses_and_remembers_nothing(
    tmp_path: Path, remotes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    mock = _NoAccounts(status=429)  # Stripe's rate limit: it did not say, and may say later
    with (
        closing(mock),
        running_sidecar(
            tmp_path,
            cast(FakeStripe, mock),  # only its url is read
            remotes[1],
            policy_text=ACCOUNT_POLICY,
            reconcile="off",
            in_process=True,
        ) as sidecar,
    ):
        for _ in range(2):  # not remembered as self: asked again, refused again
            down = refused(lambda: refund(sidecar, "pi_mock_2"))
            assert down.http_status == 503 and outcome(down) == "unavailable"
        assert mock.posts == []  # nothing forwarded
        assert sidecar.effect_state("refund:self:pi_mock_2") is None
