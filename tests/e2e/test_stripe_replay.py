"""A same-key retry of an ambiguous refund settles it only on evidence (issue 10, must-hold 1).

The laundering these stop: the first attempt is applied at Stripe but its reply is lost, so the
record is ambiguous; then a retry with the attempt's ``Idempotency-Key`` is answered before
Stripe's idempotency layer (a wrong API key, a 429, a 409 for a key in use) or refused by it
(``idempotency_error``). None of those says anything about the first attempt, so the record
must stay ambiguous; read as "not executed", the next retry would refund a second time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import stripe
from harness import STRIPE_KEY, Sidecar, running_sidecar
from stripe_support import (
    CLIENT_TIMEOUT,
    ctrlrun_block,
    events_for,
    outcome,
    refused,
    stripe_client,
    timeline,
)
from stripe_support import refund as client_refund

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def remotes() -> Iterator[tuple[FakeStripe, FakeKubernetes]]:
    with FakeStripe() as fake, FakeKubernetes() as kube:
        yield fake, kube


@pytest.fixture
def plain(tmp_path: Path, remotes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[Sidecar]:
    with running_sidecar(tmp_path, *remotes, reconcile="off", in_process=True) as sc:
        yield sc


@pytest.fixture
def fake(remotes: tuple[FakeStripe, FakeKubernetes]) -> FakeStripe:
    remotes[0].fail_next(None)
    return remotes[0]


def refunds_of(fake: FakeStripe, pi: str) -> int:
    return sum(1 for r in fake.refunds if r["payment_intent"] == pi)


def refund(client: stripe.StripeClient, pi: str, **options: Any) -> stripe.Refund:
    return client_refund(client, pi, 1000, **options)


def lose_first_reply(sc: Sidecar, fake: FakeStripe, pi: str, idem: str) -> None:
    """The first attempt is applied at the fake; its reply is lost; the record is ambiguous."""
    fake.fail_next("commit_then_drop")
    err = refused(lambda: refund(stripe_client(sc.stripe_base), pi, idempotency_key=idem))
    assert err.http_status == 504 and outcome(err) == "upstream_ambiguous"
    assert sc.effect_state(f"refund:{pi}") == "ambiguous" and refunds_of(fake, pi) == 1


def assert_still_ambiguous(sc: Sidecar, fake: FakeStripe, pi: str) -> None:
    """Every later retry (new keys, the client's own retries) is refused; one refund only."""
    for _ in range(2):
        err = refused(lambda: refund(stripe_client(sc.stripe_base), pi))
        assert err.http_status == 409 and outcome(err) == "ambiguous"
    assert sc.effect_state(f"refund:{pi}") == "ambiguous"
    assert refunds_of(fake, pi) == 1


def test_a_retry_with_a_wrong_api_key_leaves_the_refund_ambiguous(
    plain: Sidecar, fake: FakeStripe
) -> None:
    pi = fake.add_payment_intent(amount=5000)["id"]
    lose_first_reply(plain, fake, pi, f"wrong-key-{pi}")
    wrong = stripe_client(plain.stripe_base, api_key="sk_live_not_this_one")

    err = refused(lambda: refund(wrong, pi, idempotency_key=f"wrong-key-{pi}"))

    assert err.http_status == 409
    block = ctrlrun_block(err)
    assert (block["outcome"], block["reason"]) == ("ambiguous", "replay_inconclusive")
    assert "HTTP 401" in str(err) and "sk_live" not in str(err)
    assert_still_ambiguous(plain, fake, pi)
    events = events_for(timeline(plain), f"refund:{pi}")
    assert ("RECONCILIATION_RESOLVED", {"outcome": "unknown"}) in events

    # The right key with the same Idempotency-Key: Stripe replays the first answer.
    again = refund(stripe_client(plain.stripe_base), pi, idempotency_key=f"wrong-key-{pi}")

    assert again.amount == 1000 and plain.effect_state(f"refund:{pi}") == "committed"
    assert refunds_of(fake, pi) == 1


@pytest.mark.parametrize("status", [429, 409, 400, 500])
def test_a_retry_stopped_before_stripes_idempotency_layer_proves_nothing(
    plain: Sidecar, fake: FakeStripe, status: int
) -> None:
    pi = fake.add_payment_intent(amount=5000)["id"]
    lose_first_reply(plain, fake, pi, f"stopped-{status}-{pi}")
    fake.fail_next(status)  # 429 rate limit, 409 key in use, 400 validation, 500 unknown

    client = stripe_client(plain.stripe_base)
    err = refused(lambda: refund(client, pi, idempotency_key=f"stopped-{status}-{pi}"))

    assert err.http_status == 409 and ctrlrun_block(err)["reason"] == "replay_inconclusive"
    assert f"HTTP {status}" in str(err)
    assert_still_ambiguous(plain, fake, pi)

    # Until a human (or a reconciler) settles it.
    key = f"refund:{pi}"
    settled = plain.cli("resolve", key, "--committed", "--store-url", plain.store_url)
    assert settled.returncode == 0, settled.stderr
    after = refused(lambda: refund(stripe_client(plain.stripe_base), pi))
    assert outcome(after) == "duplicate" and refunds_of(fake, pi) == 1


def test_idempotency_error_for_a_differently_encoded_body_proves_nothing(
    plain: Sidecar, fake: FakeStripe
) -> None:
    # expand[0]=x and expand[]=x are one action to ctrlrun but other parameters to Stripe,
    # which refuses the old key with them (idempotency_error): no word on the first attempt.
    pi = fake.add_payment_intent(amount=5000)["id"]
    idem = f"expand-{pi}"
    headers = {"Authorization": f"Bearer {STRIPE_KEY}", "Idempotency-Key": idem}
    form = "payment_intent={pi}&amount=1000&expand{index}=balance_transaction"
    fake.fail_next("commit_then_drop")
    with httpx.Client(base_url=plain.stripe_base, timeout=CLIENT_TIMEOUT, trust_env=False) as http:
        post = form_post(http, headers)
        assert post(form.format(pi=pi, index="[0]")).status_code == 504

        retry = post(form.format(pi=pi, index="[]"))

    assert retry.status_code == 409, retry.text
    assert retry.json()["ctrlrun"]["reason"] == "replay_inconclusive"
    assert "idempotency_error" in retry.json()["error"]["message"]
    assert_still_ambiguous(plain, fake, pi)


def form_post(http: httpx.Client, headers: dict[str, str]) -> Any:
    def post(body: str, extra: list[tuple[str, str]] | None = None) -> httpx.Response:
        hdrs = [*headers.items(), ("Content-Type", "application/x-www-form-urlencoded")]
        return http.post("/v1/refunds", content=body.encode(), headers=hdrs + (extra or []))

    return post


def test_two_idempotency_keys_are_refused_and_launder_nothing(
    plain: Sidecar, fake: FakeStripe
) -> None:
    pi = fake.add_payment_intent(amount=5000)["id"]
    lose_first_reply(plain, fake, pi, f"first-{pi}")
    posts = fake.count("POST", "/v1/refunds")
    body = f"payment_intent={pi}&amount=1000"
    auth = {"Authorization": f"Bearer {STRIPE_KEY}"}
    with httpx.Client(base_url=plain.stripe_base, timeout=CLIENT_TIMEOUT, trust_env=False) as http:
        post = form_post(http, auth)
        both = post(body, [("Idempotency-Key", f"first-{pi}"), ("Idempotency-Key", f"second-{pi}")])
        underscore = post(body, [("Idempotency-Key", f"first-{pi}"), ("Idempotency_Key", "k3")])
        second = post(body, [("Idempotency-Key", f"second-{pi}")])

    for answer in (both, underscore):
        assert answer.status_code == 400
        assert answer.headers["X-Ctrlrun-Outcome"] == "invalid_request"
    assert "sent more than once" in both.json()["error"]["message"]
    assert second.status_code == 409 and second.json()["ctrlrun"]["outcome"] == "ambiguous"
    assert fake.count("POST", "/v1/refunds") == posts  # nothing of these reached the fake
    assert_still_ambiguous(plain, fake, pi)


def test_a_replayed_refusal_settles_the_record_failed(plain: Sidecar, fake: FakeStripe) -> None:
    # The first attempt was refused by Stripe (a stored 400) but its reply was lost on the way
    # back: the replay of that stored answer is evidence the refund did not happen.
    pi = fake.add_payment_intent(amount=500)["id"]  # 1000 is more than it can refund
    idem = f"refused-{pi}"
    fake.fail_next("commit_then_drop")
    err = refused(lambda: refund(stripe_client(plain.stripe_base), pi, idempotency_key=idem))
    assert err.http_status == 504 and plain.effect_state(f"refund:{pi}") == "ambiguous"

    replayed = refused(lambda: refund(stripe_client(plain.stripe_base), pi, idempotency_key=idem))

    assert replayed.http_status == 400 and replayed.code == "amount_too_large"
    assert plain.effect_state(f"refund:{pi}") == "failed" and refunds_of(fake, pi) == 0


def test_a_retry_while_stripe_still_runs_the_first_attempt_proves_nothing(
    plain: Sidecar, fake: FakeStripe
) -> None:
    # The first attempt outlives the sidecar's deadline (5 s) at the fake, which keeps working
    # on it; the same-key retry meanwhile is answered 409 idempotency_key_in_use.
    pi = fake.add_payment_intent(amount=5000)["id"]
    idem = f"busy-{pi}"
    fake.delay_next(8)
    client = stripe_client(plain.stripe_base, retries=0)
    err = refused(lambda: refund(client, pi, idempotency_key=idem))
    assert err.http_status == 504 and plain.effect_state(f"refund:{pi}") == "ambiguous"

    busy = refused(lambda: refund(client, pi, idempotency_key=idem))

    assert busy.http_status == 409 and ctrlrun_block(busy)["reason"] == "replay_inconclusive"
    assert "HTTP 409" in str(busy) and "idempotency_key_in_use" in str(busy)
    assert plain.effect_state(f"refund:{pi}") == "ambiguous"
    deadline = time.monotonic() + 20
    while refunds_of(fake, pi) == 0 and time.monotonic() < deadline:
        time.sleep(0.1)  # the first attempt finishes at the fake
    done = refund(client, pi, idempotency_key=idem)  # now Stripe replays its answer
    assert done.amount == 1000 and plain.effect_state(f"refund:{pi}") == "committed"
    assert refunds_of(fake, pi) == 1
