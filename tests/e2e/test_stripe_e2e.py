"""The official stripe client through a running ``ctrlrun proxy`` (reverse listener, plain
HTTP): at most once, honest about lost replies, and never retried into a second refund.

The proxy runs in this process (``inprocess.py``): these test what it decides, over real
sockets with the real client; the command itself is driven in ``test_stripe_tls.py``,
``test_secrets.py`` and ``test_proxy_cli.py``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import stripe
from harness import POLICY, STRIPE_KEY, Sidecar, refusing_port, running_sidecar
from stripe_support import (
    CLIENT_TIMEOUT,
    ctrlrun_block,
    effect,
    events_for,
    header,
    outcome,
    receipts_for,
    refund,
    refused,
    stripe_client,
    timeline,
)

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def remotes() -> Iterator[tuple[FakeStripe, FakeKubernetes]]:
    with FakeStripe() as fake, FakeKubernetes() as kube:
        yield fake, kube


# One proxy in this process at a time (mitmproxy's master is process-wide): each test gets its
# own, started in well under a second.


@pytest.fixture
def plain(tmp_path: Path, remotes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[Sidecar]:
    """A sidecar with no reconciler: an ambiguous attempt stays ambiguous."""
    with running_sidecar(tmp_path, *remotes, reconcile="off", in_process=True) as sc:
        yield sc


@pytest.fixture
def eager(tmp_path: Path, remotes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[Sidecar]:
    """A sidecar that asks the Stripe reconciler right after an ambiguous attempt."""
    with running_sidecar(tmp_path, *remotes, reconcile="eager", in_process=True) as sc:
        yield sc


@pytest.fixture
def unreachable(tmp_path: Path, remotes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[Sidecar]:
    """A sidecar whose Stripe upstream is a closed loopback port."""
    with refusing_port() as port:
        text = POLICY.replace("url: {stripe}", f"url: http://127.0.0.1:{port}")
        assert text != POLICY
        with running_sidecar(
            tmp_path, *remotes, policy_text=text, reconcile="off", in_process=True
        ) as sc:
            yield sc


@pytest.fixture
def fake(remotes: tuple[FakeStripe, FakeKubernetes]) -> FakeStripe:
    stripe_fake = remotes[0]
    stripe_fake.fail_next(None)
    stripe_fake.reset_counts()
    return stripe_fake


def refunds_of(fake: FakeStripe, payment_intent: str) -> int:
    return sum(1 for r in fake.refunds if r["payment_intent"] == payment_intent)


# -- 1. at most once -----------------------------------------------------------------------------


def test_refund_commits_and_a_second_refund_is_a_duplicate(
    plain: Sidecar, fake: FakeStripe
) -> None:
    pi = fake.add_payment_intent(amount=5000)["id"]
    client = stripe_client(plain.stripe_base)

    done = refund(client, pi, 1000)

    assert done.status == "succeeded" and done.amount == 1000
    assert plain.effect_state(f"refund:{pi}") == "committed"

    err = refused(lambda: refund(client, pi, 1000))

    assert isinstance(err, stripe.APIError) and err.http_status == 409
    assert outcome(err) == "duplicate"
    assert "ctrlrun:" in str(err)
    assert fake.count("POST", "/v1/refunds") == 1 and refunds_of(fake, pi) == 1
    assert [r["result"] for r in receipts_for(plain, f"refund:{pi}")] == ["committed", "blocked"]


# -- 2. commit, then the reply is lost -----------------------------------------------------------


def test_lost_reply_is_reconciled_committed_and_the_retry_refused(
    eager: Sidecar, fake: FakeStripe
) -> None:
    pi = fake.add_payment_intent(amount=5000)["id"]
    key = f"refund:{pi}"
    client = stripe_client(eager.stripe_base, retries=2)
    fake.fail_next("commit_then_drop")

    err = refused(lambda: refund(client, pi, 1000))

    assert isinstance(err, stripe.APIError) and err.http_status == 504
    block = ctrlrun_block(err)
    assert block["outcome"] == "upstream_ambiguous"
    assert block["reason"] == "reconciler: committed"
    assert eager.effect_state(key) == "committed"
    # Stripe-Should-Retry: false kept the client (2 retries allowed) from re-sending.
    assert fake.count("POST", "/v1/refunds") == 1
    assert [r["result"] for r in receipts_for(eager, key)] == ["ambiguous"]

    again = refused(lambda: refund(client, pi, 1000))

    assert again.http_status == 409 and outcome(again) == "duplicate"
    assert fake.count("POST", "/v1/refunds") == 1 and refunds_of(fake, pi) == 1
    lines = timeline(eager)
    assert [r["result"] for r in lines if r["kind"] == "receipt" and r["effect_key"] == key] == [
        "ambiguous",
        "blocked",
    ]
    events = events_for(lines, key)
    assert ("RECONCILIATION_STARTED", {"effect_key": key, "trigger": "eager"}) in events
    assert (
        "RECONCILIATION_RESOLVED",
        {
            "outcome": "committed",
            "evidence": "a refund.created event carries the attempt's Idempotency-Key",
        },
    ) in events


def test_lost_reply_without_a_reconciler_stays_ambiguous(plain: Sidecar, fake: FakeStripe) -> None:
    pi = fake.add_payment_intent(amount=5000)["id"]
    key = f"refund:{pi}"
    client = stripe_client(plain.stripe_base, retries=2)
    fake.fail_next("commit_then_drop")

    err = refused(lambda: refund(client, pi, 1000))

    assert err.http_status == 504 and outcome(err) == "upstream_ambiguous"
    assert ctrlrun_block(err)["reason"] == "reconciler: not asked"
    assert plain.effect_state(key) == "ambiguous"

    again = refused(lambda: refund(client, pi, 1000))

    assert again.http_status == 409 and outcome(again) == "ambiguous"
    assert "ctrlrun resolve" in (again.user_message or "")
    assert plain.effect_state(key) == "ambiguous"
    assert fake.count("POST", "/v1/refunds") == 1 and refunds_of(fake, pi) == 1
    assert [r["result"] for r in receipts_for(plain, key)] == ["ambiguous", "blocked"]


# -- 3. nothing sent -----------------------------------------------------------------------------


def test_connection_refused_is_failed_and_the_retry_is_forwarded(unreachable: Sidecar) -> None:
    key = "refund:pi_closedport1"
    # No client retries: each one would be a new (permitted) attempt and blur the count.
    client = stripe_client(unreachable.stripe_base, retries=0)

    first = refused(lambda: refund(client, "pi_closedport1", 1000))

    assert first.http_status is not None and first.http_status >= 500
    record = effect(unreachable, key)
    assert record is not None and (record.state.value, record.attempt) == ("failed", 1)
    assert record.error and "ConnectError" in record.error

    refused(lambda: refund(client, "pi_closedport1", 1000))

    record = effect(unreachable, key)
    assert record is not None and (record.state.value, record.attempt) == ("failed", 2)
    assert record.error and "ConnectError" in record.error
    receipts = receipts_for(unreachable, key)
    assert [(r["result"], r["attempt"]) for r in receipts] == [("failed", 1), ("failed", 2)]


def test_connection_refused_answer_says_what_happened(unreachable: Sidecar) -> None:
    client = stripe_client(unreachable.stripe_base, retries=0)

    err = refused(lambda: refund(client, "pi_closedport2", 1000))

    assert header(err, "X-Ctrlrun-Outcome") == "unavailable"
    assert header(err, "Stripe-Should-Retry") == "false"
    assert (err.user_message or "").startswith("ctrlrun:")
    assert "nothing was sent" in (err.user_message or "")


# -- 4. what the remote answered -----------------------------------------------------------------


def test_remote_500_is_ambiguous_and_the_retry_refused(plain: Sidecar, fake: FakeStripe) -> None:
    pi = fake.add_payment_intent(amount=5000)["id"]
    client = stripe_client(plain.stripe_base)
    fake.fail_next(500)

    err = refused(lambda: refund(client, pi, 1000))

    assert err.http_status == 504 and outcome(err) == "upstream_ambiguous"
    assert "HTTP 500" in (err.user_message or "")
    assert plain.effect_state(f"refund:{pi}") == "ambiguous"
    assert outcome(refused(lambda: refund(client, pi, 1000))) == "ambiguous"
    assert fake.count("POST", "/v1/refunds") == 1


def test_remote_400_is_failed_and_the_retry_is_forwarded(plain: Sidecar, fake: FakeStripe) -> None:
    pi = fake.add_payment_intent(amount=5000)["id"]
    key = f"refund:{pi}"
    client = stripe_client(plain.stripe_base)
    fake.fail_next(400)

    err = refused(lambda: refund(client, pi, 1000))

    # The remote's own answer reaches the agent untouched.
    assert isinstance(err, stripe.InvalidRequestError) and err.http_status == 400
    assert header(err, "X-Ctrlrun-Outcome") is None
    assert err.code == "parameter_invalid_empty"
    record = effect(plain, key)
    assert record is not None and (record.state.value, record.attempt) == ("failed", 1)

    done = refund(client, pi, 1000)

    assert done.status == "succeeded"
    record = effect(plain, key)
    assert record is not None and (record.state.value, record.attempt) == ("committed", 2)
    assert fake.count("POST", "/v1/refunds") == 2 and refunds_of(fake, pi) == 1


def test_denied_payout_is_refused_with_no_upstream_call(plain: Sidecar, fake: FakeStripe) -> None:
    client = stripe_client(plain.stripe_base)

    err = refused(lambda: client.v1.payouts.create(params={"amount": 1000, "currency": "usd"}))

    assert isinstance(err, stripe.PermissionError) and err.http_status == 403
    block = ctrlrun_block(err)
    assert (block["outcome"], block["action"]) == ("denied", "stripe.payout")
    assert fake.requests == [] and fake.payouts == []


# -- 8. many agents at once ----------------------------------------------------------------------


def test_fifty_clients_sending_the_same_refund_reach_the_remote_once(
    plain: Sidecar, fake: FakeStripe
) -> None:
    pi = fake.add_payment_intent(amount=5000)["id"]
    clients = [stripe_client(plain.stripe_base, retries=2) for _ in range(50)]
    start = threading.Barrier(len(clients), timeout=CLIENT_TIMEOUT)

    def send(client: stripe.StripeClient) -> str:
        start.wait()
        try:
            refund(client, pi, 1000)
        except stripe.StripeError as err:
            return outcome(err)
        return "ok"

    with ThreadPoolExecutor(len(clients)) as pool:
        results = Counter(pool.map(send, clients, timeout=60))

    assert results["ok"] == 1, results
    assert set(results) <= {"ok", "in_progress", "duplicate"}, results
    assert fake.count("POST", "/v1/refunds") == 1 and refunds_of(fake, pi) == 1
    receipts = receipts_for(plain, f"refund:{pi}")
    assert [r["result"] for r in receipts].count("committed") == 1
    assert len(receipts) == 50


# -- 12. the client's own same-key retry ---------------------------------------------------------


def test_same_key_retry_of_an_ambiguous_attempt_is_forwarded_and_settles_it(
    plain: Sidecar, fake: FakeStripe
) -> None:
    pi = fake.add_payment_intent(amount=5000)["id"]
    key = f"refund:{pi}"
    headers = {"Authorization": f"Bearer {STRIPE_KEY}", "Idempotency-Key": f"e2e-{pi}"}
    form = {"payment_intent": pi, "amount": "1000"}
    fake.fail_next("commit_then_drop")
    with httpx.Client(base_url=plain.stripe_base, timeout=CLIENT_TIMEOUT, trust_env=False) as http:
        lost = http.post("/v1/refunds", data=form, headers=headers)

        assert lost.status_code == 504 and plain.effect_state(key) == "ambiguous"

        replay = http.post("/v1/refunds", data=form, headers=headers)

    assert replay.status_code == 200, replay.text
    assert replay.headers.get("Idempotent-Replayed") == "true"
    assert replay.json()["payment_intent"] == pi
    assert plain.effect_state(key) == "committed"
    assert fake.count("POST", "/v1/refunds") == 2 and refunds_of(fake, pi) == 1
    events = events_for(timeline(plain), key)
    assert ("RECONCILIATION_STARTED", {"effect_key": key, "trigger": "idempotent_replay"}) in events
    assert ("RECONCILIATION_RESOLVED", {"outcome": "committed"}) in events


def test_same_key_with_a_changed_body_is_not_a_replay(plain: Sidecar, fake: FakeStripe) -> None:
    # The old key on another request is a new intent, not a transport retry: Stripe refuses
    # it (idempotency_error), which must not be read as "the first attempt did nothing".
    pi = fake.add_payment_intent(amount=5000)["id"]
    key = f"refund:{pi}"
    headers = {"Authorization": f"Bearer {STRIPE_KEY}", "Idempotency-Key": f"e2e-{pi}"}
    fake.fail_next("commit_then_drop")
    with httpx.Client(base_url=plain.stripe_base, timeout=CLIENT_TIMEOUT, trust_env=False) as http:
        lost = http.post(
            "/v1/refunds", data={"payment_intent": pi, "amount": "1000"}, headers=headers
        )
        assert lost.status_code == 504

        changed = http.post(
            "/v1/refunds", data={"payment_intent": pi, "amount": "2000"}, headers=headers
        )

        assert changed.status_code == 409, changed.text
        assert changed.json()["ctrlrun"]["outcome"] == "ambiguous"
        assert plain.effect_state(key) == "ambiguous"

        fresh = http.post(
            "/v1/refunds",
            data={"payment_intent": pi, "amount": "1000"},
            headers={"Authorization": f"Bearer {STRIPE_KEY}"},
        )

    assert fresh.status_code == 409 and fresh.json()["ctrlrun"]["outcome"] == "ambiguous"
    assert fake.count("POST", "/v1/refunds") == 1 and refunds_of(fake, pi) == 1


def test_same_key_retry_is_not_replayed_once_the_policy_denies_it(
    tmp_path: Path, remotes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    stripe, kube = remotes
    with running_sidecar(tmp_path, stripe, kube, reconcile="off", in_process=True) as sc:
        pi = stripe.add_payment_intent(amount=5000)["id"]
        headers = {"Authorization": f"Bearer {STRIPE_KEY}", "Idempotency-Key": f"deny-{pi}"}
        form = {"payment_intent": pi, "amount": "1000"}
        posts = stripe.count("POST", "/v1/refunds")  # the fake is shared with other tests
        stripe.fail_next("reset_before")  # nothing applied: a replay would refund now
        with httpx.Client(base_url=sc.stripe_base, timeout=CLIENT_TIMEOUT, trust_env=False) as http:
            assert http.post("/v1/refunds", data=form, headers=headers).status_code == 504
            denying = (
                sc.policy.read_text()
                .replace("      - when: {amount_lte: 100000}\n        decision: allow\n", "")
                .replace("      - decision: approve\n", "      - decision: deny\n")
            )
            sc.policy.write_text(denying)
            sc.reload()
            deadline = time.monotonic() + 20
            while "policy reloaded" not in sc.log.read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
            retry = http.post("/v1/refunds", data=form, headers=headers)
        assert retry.status_code == 403 and retry.headers["X-Ctrlrun-Outcome"] == "denied"
        assert stripe.count("POST", "/v1/refunds") == posts + 1 and refunds_of(stripe, pi) == 0
        assert sc.effect_state(f"refund:{pi}") == "ambiguous"
