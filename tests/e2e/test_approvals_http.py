"""Approvals over HTTP: the official stripe client asks, a human runs ``ctrlrun approve``, the
client re-sends with ``Ctrlrun-Approval`` (a per-request header option of stripe-python)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import stripe
from harness import Sidecar, running_sidecar
from stripe_support import (
    ctrlrun_block,
    effect,
    outcome,
    receipts_for,
    refund,
    refused,
    stripe_client,
)

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(120)
BIG = 150_000  # over the harness policy's 100000: stripe.refund needs approval


@pytest.fixture(scope="module")
def remotes() -> Iterator[tuple[FakeStripe, FakeKubernetes]]:
    with FakeStripe() as fake, FakeKubernetes() as kube:
        yield fake, kube


@pytest.fixture(scope="module")
def sc(
    tmp_path_factory: pytest.TempPathFactory, remotes: tuple[FakeStripe, FakeKubernetes]
) -> Iterator[Sidecar]:
    with running_sidecar(
        tmp_path_factory.mktemp("approvals"), *remotes, reconcile="off", in_process=True
    ) as sidecar:
        yield sidecar


@pytest.fixture
def fake(remotes: tuple[FakeStripe, FakeKubernetes]) -> FakeStripe:
    stripe_fake = remotes[0]
    stripe_fake.fail_next(None)
    stripe_fake.reset_counts()
    return stripe_fake


def approval(request_id: str) -> dict[str, dict[str, str]]:
    return {"headers": {"Ctrlrun-Approval": request_id}}


def ask(client: stripe.StripeClient, pi: str, amount: int) -> str:
    """Send a refund that needs approval; return the request id ctrlrun answered with."""
    err = refused(lambda: refund(client, pi, amount))
    assert isinstance(err, stripe.PermissionError) and err.http_status == 403
    block = ctrlrun_block(err)
    assert block["outcome"] == "approval_required"
    assert block["request_id"].startswith("apr_")
    assert f"ctrlrun approve {block['request_id']}" in (err.user_message or "")
    return str(block["request_id"])


def test_approval_round_trip_through_the_header(sc: Sidecar, fake: FakeStripe) -> None:
    pi = fake.add_payment_intent(amount=500_000)["id"]
    key = f"refund:{pi}"
    client = stripe_client(sc.stripe_base)

    request_id = ask(client, pi, BIG)

    assert fake.requests == [] and effect(sc, key) is None
    granted = sc.cli("approve", request_id, "--store-url", sc.store_url)
    assert granted.returncode == 0, granted.stderr

    # A changed request on the same approval is refused and leaves the approval usable.
    changed = refused(lambda: refund(client, pi, BIG + 1, **approval(request_id)))

    assert changed.http_status == 403
    block = ctrlrun_block(changed)
    assert (block["outcome"], block["reason"], block["request_id"]) == (
        "approval_invalid",
        "mismatch",
        request_id,
    )
    assert fake.requests == []

    done = refund(client, pi, BIG, **approval(request_id))

    assert done.status == "succeeded" and done.amount == BIG
    assert sc.effect_state(key) == "committed"
    committed = [r for r in receipts_for(sc, key) if r["result"] == "committed"]
    assert len(committed) == 1
    assert (committed[0]["decision"], committed[0]["approval_id"]) == ("approve", request_id)
    assert committed[0]["approver"]

    # Single use: the same approval again is not a second refund.
    again = refused(lambda: refund(client, pi, BIG, **approval(request_id)))

    assert again.http_status in (403, 409) and outcome(again) in ("duplicate", "approval_invalid")
    assert fake.count("POST", "/v1/refunds") == 1 and len(fake.refunds) == 1


def test_consumed_approval_does_not_cover_another_payment(sc: Sidecar, fake: FakeStripe) -> None:
    first = fake.add_payment_intent(amount=500_000)["id"]
    second = fake.add_payment_intent(amount=500_000)["id"]
    client = stripe_client(sc.stripe_base)
    request_id = ask(client, first, BIG)
    assert sc.cli("approve", request_id, "--store-url", sc.store_url).returncode == 0
    refund(client, first, BIG, **approval(request_id))

    err = refused(lambda: refund(client, second, BIG, **approval(request_id)))

    assert err.http_status == 403 and outcome(err) == "approval_invalid"
    assert sc.effect_state(f"refund:{second}") is None
    assert fake.count("POST", "/v1/refunds") == 1


def test_denied_approval_is_refused_and_nothing_forwarded(sc: Sidecar, fake: FakeStripe) -> None:
    pi = fake.add_payment_intent(amount=500_000)["id"]
    client = stripe_client(sc.stripe_base)
    request_id = ask(client, pi, BIG)
    denied = sc.cli("deny", request_id, "--store-url", sc.store_url)
    assert denied.returncode == 0, denied.stderr

    err = refused(lambda: refund(client, pi, BIG, **approval(request_id)))

    assert err.http_status == 403
    block = ctrlrun_block(err)
    assert (block["outcome"], block["reason"]) == ("approval_invalid", "approval_denied")
    assert block["request_id"] == request_id
    assert block["request_id"] == request_id
    assert fake.requests == [] and sc.effect_state(f"refund:{pi}") is None


def test_small_refund_needs_no_approval(sc: Sidecar, fake: FakeStripe) -> None:
    pi = fake.add_payment_intent(amount=500_000)["id"]

    done = refund(stripe_client(sc.stripe_base), pi, 100_000)

    assert done.status == "succeeded"
    assert [r["decision"] for r in receipts_for(sc, f"refund:{pi}")] == ["allow"]


def test_the_identical_refund_resent_without_the_header_consumes_the_approval(
    sc: Sidecar, fake: FakeStripe
) -> None:
    pi = fake.add_payment_intent(amount=500_000)["id"]
    client = stripe_client(sc.stripe_base)
    request_id = ask(client, pi, BIG)
    assert sc.cli("approve", request_id, "--store-url", sc.store_url).returncode == 0

    # A changed refund is a new request; the approval waits for the one it was granted for.
    changed = ask(client, pi, BIG - 1)
    assert changed != request_id and fake.requests == []

    done = refund(client, pi, BIG)  # no Ctrlrun-Approval: a new Idempotency-Key, same action

    assert done.status == "succeeded"
    (committed,) = [r for r in receipts_for(sc, f"refund:{pi}") if r["result"] == "committed"]
    assert committed["approval_id"] == request_id
    assert fake.count("POST", "/v1/refunds") == 1
