"""Attacks on Stripe refunds across an upgrade and across credentials, with the official client.

A ledger written before ctrlrun learned a key's own account keyed a refund without
``Stripe-Account`` as ``refund:self:pi``; the same refund is now ``refund:acct_…:pi``. "Before"
is played by a sidecar whose remote serves no ``GET /v1/account`` (a forwarder in front of the
fake Stripe that answers it 404, so writes are keyed ``self``, as they were), "after" by a
sidecar on the same ledger talking to the fake Stripe itself.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from harness import POLICY, STRIPE_KEY, Sidecar, start_sidecar
from mcp_support import receipt_meta, session, start_mcp_sidecar
from sqlalchemy import update
from stripe_support import outcome, refused
from stripe_support import stripe_client as client_for

from ctrlrun.action import iso, utc_now
from ctrlrun.schema import effects
from ctrlrun.testing import FakeKubernetes, FakeStripe
from ctrlrun.testing.stripe_mcp import FakeStripeMcp

pytestmark = pytest.mark.timeout(180)
OWN_KEY = "sk_test_acctA_own_key_5"  # acct_A's own secret key
ACCOUNT_POLICY = POLICY.replace(
    '    effect: "refund:{{payment_id}}"\n', '    effect: "refund:{{account}}:{{payment_id}}"\n'
)
assert ACCOUNT_POLICY != POLICY


class Before:
    """The fake Stripe as a ctrlrun that never learned accounts saw it: no GET /v1/account."""

    def __init__(self, fake: FakeStripe, *, charges_alone: bool = False) -> None:
        upstream = fake.url

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                if self.path.split("?")[0] == "/v1/account":
                    self._send(404, b'{"error": {"type": "invalid_request_error"}}', [])
                    return
                self._relay()

            def do_POST(self) -> None:
                self._relay()

            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                skip = {"host", "content-length", "connection"}
                headers = [(k, v) for k, v in self.headers.items() if k.lower() not in skip]
                try:
                    answer = httpx.request(
                        self.command, upstream + self.path, headers=headers, content=body,
                        timeout=15, trust_env=False,
                    )  # fmt: skip
                except httpx.TransportError:  # the fake dropped it: so does this one
                    self.close_connection = True
                    return
                keep = [(k, v) for k, v in answer.headers.items() if k.lower() not in skip]
                data = answer.content
                if charges_alone and self.command == "GET" and "/v1/charges/" in self.path:
                    # As before a charge was resolved to its payment: keyed by the charge.
                    data = json.dumps(answer.json() | {"payment_intent": None}).encode()
                self._send(answer.status_code, data, keep)

            def _send(self, status: int, data: bytes, headers: list[tuple[str, str]]) -> None:
                self.send_response(status)
                for name, value in headers:
                    if name.lower() not in ("content-encoding", "transfer-encoding", "date"):
                        self.send_header(name, value)
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


@pytest.fixture(scope="module")
def remotes() -> Iterator[tuple[FakeStripe, FakeKubernetes]]:
    with FakeStripe() as fake, FakeKubernetes() as kube:
        fake.add_account("acct_A", key=OWN_KEY)
        yield fake, kube


@pytest.fixture
def fake(remotes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[FakeStripe]:
    remotes[0].fail_next(None)
    remotes[0].fail_reads(None)
    yield remotes[0]
    remotes[0].fail_next(None)


@pytest.fixture
def before(fake: FakeStripe) -> Iterator[Before]:
    shim = Before(fake)
    yield shim
    shim.close()


def sidecar(
    tmp_path: Path,
    remotes: tuple[FakeStripe, FakeKubernetes],
    stripe: FakeStripe | Before,
    *,
    policy: str = ACCOUNT_POLICY,
    reconcile: str = "off",
) -> Sidecar:
    return start_sidecar(
        tmp_path,
        cast(FakeStripe, stripe),  # only its url is read
        remotes[1],
        policy_text=policy,
        reconcile=reconcile,
        in_process=True,
    )


def refund(sc: Sidecar, pi: str, *, key: str = STRIPE_KEY, account: str | None = None) -> Any:
    options: dict[str, Any] = {"stripe_account": account} if account else {}
    params = {"payment_intent": pi, "amount": 100}
    client = client_for(sc.stripe_base, api_key=key, retries=0)
    return client.v1.refunds.create(params=params, options=options)  # type: ignore[arg-type]


WAYS: dict[str, dict[str, Any]] = {
    "platform": {},
    "platform-by-id": {"account": "PLATFORM"},
    "own-key": {"key": OWN_KEY},
    "platform-for-A": {"account": "acct_A"},
}


def way(fake: FakeStripe, name: str) -> dict[str, Any]:
    given = dict(WAYS[name])
    if given.get("account") == "PLATFORM":
        given["account"] = fake.platform_id
    return given


def on_account(name: str) -> str | None:
    return "acct_A" if name in ("own-key", "platform-for-A") else None


def refunds_of(fake: FakeStripe, account: str | None, pi: str) -> int:
    return [r["payment_intent"] for r in fake.refunds_in(account)].count(pi)


def age(sc: Sidecar, effect_key: str) -> None:
    """Move the attempt's times past its settle window, as if minutes had passed."""
    past = iso(utc_now() - timedelta(seconds=300))
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


# -- an upgrade: records keyed `self` -----------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ("platform", "platform"),
        ("platform", "platform-by-id"),
        ("own-key", "own-key"),
        ("own-key", "platform-for-A"),
    ],
)
def test_a_refund_recorded_as_self_is_a_duplicate_after_the_upgrade(
    tmp_path: Path,
    remotes: tuple[FakeStripe, FakeKubernetes],
    fake: FakeStripe,
    before: Before,
    first: str,
    then: str,
) -> None:
    account = on_account(first)
    pi = fake.add_payment_intent(amount=5000, account=account)["id"]
    old = sidecar(tmp_path, remotes, before)
    try:
        assert refund(old, pi, **way(fake, first)).amount == 100
    finally:
        old.stop()
    assert old.effect_state(f"refund:self:{pi}") == "committed"

    new = sidecar(tmp_path, remotes, fake)
    try:
        again = refused(lambda: refund(new, pi, **way(fake, then)))
    finally:
        new.stop()

    assert again.http_status == 409 and outcome(again) == "duplicate", again
    assert refunds_of(fake, account, pi) == 1
    named = account or fake.platform_id
    assert new.effect_state(f"refund:{named}:{pi}") is None  # one record: the one it had


@pytest.mark.parametrize(("reconcile", "expected"), [("off", "ambiguous"), ("lazy", "duplicate")])
def test_an_ambiguous_self_refund_is_not_made_again_through_the_other_credential(
    tmp_path: Path,
    remotes: tuple[FakeStripe, FakeKubernetes],
    fake: FakeStripe,
    before: Before,
    reconcile: str,
    expected: str,
) -> None:
    pi = fake.add_payment_intent(amount=5000, account="acct_A")["id"]
    old = sidecar(tmp_path, remotes, before)
    try:
        fake.fail_next("commit_then_drop")
        lost = refused(lambda: refund(old, pi, key=OWN_KEY))
        assert lost.http_status == 504 and outcome(lost) == "upstream_ambiguous"
    finally:
        old.stop()
    assert refunds_of(fake, "acct_A", pi) == 1

    new = sidecar(tmp_path, remotes, fake, reconcile=reconcile)
    try:
        again = refused(lambda: refund(new, pi, account="acct_A"))  # the platform's key
    finally:
        new.stop()

    assert outcome(again) == expected, again
    assert refunds_of(fake, "acct_A", pi) == 1
    assert new.effect_state(f"refund:self:{pi}") == (
        "ambiguous" if reconcile == "off" else "committed"
    )
    assert new.effect_state(f"refund:acct_A:{pi}") is None


def test_a_failed_self_refund_is_renewed_under_its_own_key_once(
    tmp_path: Path, remotes: tuple[FakeStripe, FakeKubernetes], fake: FakeStripe, before: Before
) -> None:
    pi = fake.add_payment_intent(amount=5000)["id"]
    old = sidecar(tmp_path, remotes, before)
    try:
        fake.fail_next(402)
        declined = refused(lambda: refund(old, pi))
        assert declined.http_status == 402
    finally:
        old.stop()
    assert old.effect_state(f"refund:self:{pi}") == "failed"

    new = sidecar(tmp_path, remotes, fake)
    try:
        assert refund(new, pi).amount == 100
        again = refused(lambda: refund(new, pi, account=fake.platform_id))
    finally:
        new.stop()

    assert again.http_status == 409 and outcome(again) == "duplicate"
    assert refunds_of(fake, None, pi) == 1
    assert new.effect_state(f"refund:self:{pi}") == "committed"
    assert new.effect_state(f"refund:{fake.platform_id}:{pi}") is None


def test_a_standing_self_record_outweighs_a_failed_record_under_the_account(
    tmp_path: Path, remotes: tuple[FakeStripe, FakeKubernetes], fake: FakeStripe, before: Before
) -> None:
    # A payment keyed both ways: declined once after the upgrade, then refunded by a sidecar
    # still keying `self` (a rolling upgrade); a third try must see the refund.
    pi = fake.add_payment_intent(amount=5000)["id"]
    new = sidecar(tmp_path / "a", remotes, fake)
    try:
        fake.fail_next(402)
        assert refused(lambda: refund(new, pi)).http_status == 402
    finally:
        new.stop()
    assert new.effect_state(f"refund:{fake.platform_id}:{pi}") == "failed"
    old = sidecar(tmp_path / "a", remotes, before)
    try:
        assert refund(old, pi).amount == 100
    finally:
        old.stop()

    new = sidecar(tmp_path / "a", remotes, fake)
    try:
        again = refused(lambda: refund(new, pi))
    finally:
        new.stop()

    assert again.http_status == 409 and outcome(again) == "duplicate", again
    assert refunds_of(fake, None, pi) == 1


# -- a retry through another credential, asked of Stripe ----------------------------------------


@pytest.mark.parametrize(
    "policy", [ACCOUNT_POLICY, POLICY], ids=["upgraded-account-policy", "policy-without-account"]
)
def test_another_keys_empty_answer_does_not_settle_an_ambiguous_refund(
    tmp_path: Path,
    remotes: tuple[FakeStripe, FakeKubernetes],
    fake: FakeStripe,
    before: Before,
    policy: str,
) -> None:
    # acct_A's own key refunded, its reply lost. A retry with the platform's key and no
    # Stripe-Account reaches the same record (self), and its reconcile asks the platform,
    # where acct_A's payment and its refund are not: that proves nothing. Had it said
    # not_executed, the record would fail and acct_A's own key could refund again.
    pi = fake.add_payment_intent(amount=5000, account="acct_A")["id"]
    effect_key = f"refund:self:{pi}" if policy is ACCOUNT_POLICY else f"refund:{pi}"
    old = sidecar(tmp_path, remotes, before, policy=policy)
    try:
        fake.fail_next("commit_then_drop")
        assert outcome(refused(lambda: refund(old, pi, key=OWN_KEY))) == "upstream_ambiguous"
    finally:
        old.stop()
    age(old, effect_key)

    new = sidecar(tmp_path, remotes, fake, policy=policy, reconcile="lazy")
    try:
        other = refused(lambda: refund(new, pi))  # the platform's key, no Stripe-Account
        again = refused(lambda: refund(new, pi, key=OWN_KEY))
    finally:
        new.stop()

    assert outcome(other) == "ambiguous", other
    assert outcome(again) in ("ambiguous", "duplicate"), again
    assert refunds_of(fake, "acct_A", pi) == 1
    assert new.effect_state(effect_key) in ("ambiguous", "committed")


# -- the same Idempotency-Key retried through another credential -------------------------------


def keyed(
    sc: Sidecar, pi: str, idem: str, *, key: str = STRIPE_KEY, account: str | None = None
) -> Any:
    options: dict[str, Any] = {"idempotency_key": f"{idem}-{pi}"}  # Stripe keeps keys 24 h
    if account:
        options["stripe_account"] = account
    client = client_for(sc.stripe_base, api_key=key, retries=0)
    params = {"payment_intent": pi, "amount": 100}
    return client.v1.refunds.create(params=params, options=options)  # type: ignore[arg-type]


@pytest.fixture
def lost_on_a(
    tmp_path: Path, remotes: tuple[FakeStripe, FakeKubernetes], fake: FakeStripe
) -> Iterator[tuple[Sidecar, str]]:
    """acct_A's payment refunded through the platform's key with Stripe-Account, reply lost."""
    pi = fake.add_payment_intent(amount=5000, account="acct_A")["id"]
    sc = sidecar(tmp_path, remotes, fake)
    fake.fail_next("commit_then_drop")
    lost = refused(lambda: keyed(sc, pi, "idem-lost-1", account="acct_A"))
    assert outcome(lost) == "upstream_ambiguous"
    assert sc.effect_state(f"refund:acct_A:{pi}") == "ambiguous"
    yield sc, pi
    sc.stop()


def test_the_same_key_through_the_accounts_own_key_is_stripes_replay(
    lost_on_a: tuple[Sidecar, str], fake: FakeStripe
) -> None:
    sc, pi = lost_on_a

    replayed = keyed(sc, pi, "idem-lost-1", key=OWN_KEY)  # one account, one idempotency scope

    assert replayed.amount == 100
    assert refunds_of(fake, "acct_A", pi) == 1
    assert sc.effect_state(f"refund:acct_A:{pi}") == "committed"
    again = refused(lambda: keyed(sc, pi, "idem-new-2", key=OWN_KEY))
    assert outcome(again) == "duplicate"
    assert refunds_of(fake, "acct_A", pi) == 1


def test_the_same_key_through_another_accounts_scope_settles_nothing(
    lost_on_a: tuple[Sidecar, str], fake: FakeStripe
) -> None:
    sc, pi = lost_on_a
    posts = fake.count("POST")

    # The platform's key with no Stripe-Account acts on the platform: another effect key
    # (Stripe has no refund under this idempotency key there, and no such payment).
    elsewhere = refused(lambda: keyed(sc, pi, "idem-lost-1"))
    # acct_A's own key naming its own account, under a new key: the same effect, ambiguous.
    named = refused(lambda: keyed(sc, pi, "idem-other-3", key=OWN_KEY, account="acct_A"))

    assert elsewhere.http_status == 404, elsewhere  # Stripe's own answer: no such payment
    assert sc.effect_state(f"refund:{fake.platform_id}:{pi}") == "failed"
    assert named.http_status == 409 and outcome(named) == "ambiguous", named
    assert fake.count("POST") - posts == 1  # the platform's refund of a payment it lacks
    assert refunds_of(fake, "acct_A", pi) == 1
    assert sc.effect_state(f"refund:acct_A:{pi}") == "ambiguous"


def test_self_under_two_keys_is_no_replay_of_one_scope_in_another(
    tmp_path: Path, remotes: tuple[FakeStripe, FakeKubernetes], fake: FakeStripe
) -> None:
    # A policy that does not read account: acct_A's own key and the platform's key are both
    # `self`, one action, so the same Idempotency-Key is forwarded as a replay; Stripe finds
    # nothing under it on the platform (no such payment), and that settles nothing.
    pi = fake.add_payment_intent(amount=5000, account="acct_A")["id"]
    sc = sidecar(tmp_path, remotes, fake, policy=POLICY)
    try:
        fake.fail_next("commit_then_drop")
        assert outcome(refused(lambda: keyed(sc, pi, "idem-self-1", key=OWN_KEY))) == (
            "upstream_ambiguous"
        )
        other = refused(lambda: keyed(sc, pi, "idem-self-1"))
        mine = keyed(sc, pi, "idem-self-1", key=OWN_KEY)
    finally:
        sc.stop()

    assert outcome(other) == "ambiguous", other
    assert mine.amount == 100  # Stripe's replay on acct_A settles it
    assert refunds_of(fake, "acct_A", pi) == 1
    assert sc.effect_state(f"refund:{pi}") == "committed"


def test_an_mcp_refund_recorded_as_self_is_a_duplicate_after_the_upgrade(
    tmp_path: Path, remotes: tuple[FakeStripe, FakeKubernetes], fake: FakeStripe, before: Before
) -> None:
    pi = fake.add_payment_intent(amount=5000)["id"]

    async def through_mcp(sc: Sidecar) -> Any:
        async with session(server.url, sc.proxy_url) as s:
            return await s.call_tool("create_refund", {"payment_intent": pi, "amount": 100})

    with FakeStripeMcp(fake, json_response=True) as server:
        old = start_mcp_sidecar(tmp_path, cast(FakeStripe, before), remotes[1], server)
        try:
            first = asyncio.run(through_mcp(old))
        finally:
            old.stop()
        assert not first.isError, first
        assert old.effect_state(f"refund:self:{pi}") == "committed"

        new = start_mcp_sidecar(tmp_path, fake, remotes[1], server, reconcile="off")
        try:
            again = asyncio.run(through_mcp(new))
            rest = refused(lambda: refund(new, pi))
        finally:
            new.stop()

    assert again.isError and receipt_meta(again)["outcome"] == "duplicate", again
    assert receipt_meta(again)["effect_key"] == f"refund:self:{pi}"
    assert rest.http_status == 409 and outcome(rest) == "duplicate", rest
    assert refunds_of(fake, None, pi) == 1


@pytest.mark.parametrize("then", ["by-charge", "legacy-path"])
def test_a_refund_keyed_by_its_charge_before_the_upgrade_is_the_same_refund(
    tmp_path: Path, remotes: tuple[FakeStripe, FakeKubernetes], fake: FakeStripe, then: str
) -> None:
    paid = fake.add_payment_intent(amount=5000)
    pi, charge = paid["id"], paid["latest_charge"]
    shim = Before(fake, charges_alone=True)
    old = sidecar(tmp_path, remotes, shim)
    client = client_for(old.stripe_base, retries=0)
    try:
        fake.fail_next("commit_then_drop")
        lost = refused(lambda: client.v1.refunds.create(params={"charge": charge, "amount": 100}))
        assert outcome(lost) == "upstream_ambiguous"
    finally:
        old.stop()
        shim.close()
    assert old.effect_state(f"refund:self:{charge}") == "ambiguous"

    new = sidecar(tmp_path, remotes, fake)
    client = client_for(new.stripe_base, retries=0)

    def legacy() -> Any:
        answer = httpx.post(
            f"{new.stripe_base}/v1/charges/{charge}/refund",
            data={"amount": "100"},
            headers={"Authorization": f"Bearer {STRIPE_KEY}"},
            timeout=15,
            trust_env=False,
        )
        return answer.status_code, answer.headers.get("X-Ctrlrun-Outcome")

    try:
        if then == "legacy-path":
            assert legacy() == (409, "ambiguous")
        else:
            again = refused(
                lambda: client.v1.refunds.create(params={"charge": charge, "amount": 100})
            )
            assert again.http_status == 409 and outcome(again) == "ambiguous", again
    finally:
        new.stop()

    assert refunds_of(fake, None, pi) == 1
    assert new.effect_state(f"refund:{fake.platform_id}:{pi}") is None
