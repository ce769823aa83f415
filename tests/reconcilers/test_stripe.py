"""StripeReconciler against the real fake Stripe on loopback."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from ctrlrun.context import idempotency_token_for
from ctrlrun.reconcilers import EffectFacts, StripeReconciler, StripeTarget
from ctrlrun.reconcilers.http import SETTLE_MARGIN
from ctrlrun.testing import FakeStripe

KEY = "sk_test_reconcilers"
AUTH = {"authorization": f"Bearer {KEY}"}
ATTEMPT_KEY = "attempt-key-1"

Seed = Callable[[FakeStripe, dict[str, Any], int], None]


def facts(action: str, arguments: dict[str, Any], **kw: Any) -> EffectFacts:
    kw.setdefault("idempotency_key", ATTEMPT_KEY)
    kw.setdefault("credentials", AUTH)
    kw.setdefault("attempt_started_at", datetime.now(UTC))
    return EffectFacts(effect_key=f"{action}:effect", action=action, arguments=arguments, **kw)


def refund(amount: int, *, key: str | None = None, age: int = 0, charge: bool = False) -> Seed:
    """Seed a refund of the payment ``age`` seconds before the attempt started."""

    def seed(fake: FakeStripe, pi: dict[str, Any], started: int) -> None:
        target = {"charge": pi["latest_charge"]} if charge else {"payment_intent": pi["id"]}
        fake.add_refund(**target, amount=amount, created=started - age, idempotency_key=key)

    return seed


def other_payment_refund(amount: int) -> Seed:
    def seed(fake: FakeStripe, pi: dict[str, Any], started: int) -> None:
        other = fake.add_payment_intent(amount=10_000)
        fake.add_refund(payment_intent=other["id"], amount=amount, idempotency_key=ATTEMPT_KEY)

    return seed


@pytest.mark.parametrize(
    ("seeds", "amount", "by", "expected"),
    [
        pytest.param([], 500, "payment_intent", "not_executed", id="no-refund"),
        pytest.param([refund(500)], 500, "payment_intent", "committed", id="one-by-amount"),
        pytest.param([refund(500)], None, "payment_intent", "committed", id="one-no-amount"),
        pytest.param([refund(500, charge=True)], 500, "charge", "committed", id="by-charge"),
        pytest.param([refund(500)], 500, "payment_id", "committed", id="payment-id-alias"),
        pytest.param([refund(700)], 500, "payment_intent", "not_executed", id="other-amount"),
        pytest.param([refund(500, age=60)], 500, "payment_intent", "not_executed", id="too-old"),
        pytest.param([refund(500, age=4)], 500, "payment_intent", "committed", id="within-skew"),
        pytest.param(
            [refund(500), refund(500)], 500, "payment_intent", "unknown", id="two-candidates"
        ),
        pytest.param([refund(500), refund(500)], None, "payment_intent", "unknown", id="two-any"),
        pytest.param(
            [refund(500), refund(500, key=ATTEMPT_KEY)],
            500,
            "payment_intent",
            "committed",
            id="two-but-one-has-the-key",
        ),
        pytest.param(
            [refund(900, key=ATTEMPT_KEY)], 500, "payment_intent", "committed", id="key-wins"
        ),
        pytest.param(
            [other_payment_refund(500)], 500, "payment_intent", "not_executed", id="other-payment"
        ),
    ],
)
def test_refund(
    stripe_fake: FakeStripe, seeds: list[Seed], amount: int | None, by: str, expected: str
) -> None:
    pi = stripe_fake.add_payment_intent(amount=10_000)
    started = datetime.now(UTC)
    for seed in seeds:
        seed(stripe_fake, pi, int(started.timestamp()))
    target = pi["latest_charge"] if by == "charge" else pi["id"]
    arguments = {by: target} | ({} if amount is None else {"amount": amount})
    answer = StripeReconciler(stripe_fake.url)(
        facts("stripe.refund", arguments, attempt_started_at=started)
    )
    assert answer == expected


def test_refund_matches_the_token_the_proxy_injected(stripe_fake: FakeStripe) -> None:
    """No client key: the attempt went out with idempotency_token_for(effect key, attempt)."""
    pi = stripe_fake.add_payment_intent(amount=10_000)
    token = idempotency_token_for("stripe.refund:effect", 3)
    stripe_fake.add_refund(payment_intent=pi["id"], amount=500, idempotency_key=token)
    stripe_fake.add_refund(payment_intent=pi["id"], amount=500)
    reconciler = StripeReconciler(stripe_fake.url)
    args = {"payment_intent": pi["id"], "amount": 500}
    assert reconciler(facts("stripe.refund", args, idempotency_key=None, attempt=3)) == "committed"
    assert reconciler(facts("stripe.refund", args, idempotency_key=None, attempt=2)) == "unknown"


@pytest.mark.parametrize(
    ("match_age", "max_pages", "expected", "pages_read"),
    [
        pytest.param(0, 50, "committed", 3, id="match-on-page-3"),
        pytest.param(None, 50, "not_executed", 3, id="no-match-in-3-pages"),
        pytest.param(0, 2, "unknown", 2, id="page-bound-reached"),
    ],
)
def test_refund_pages_through_the_list(
    stripe_fake: FakeStripe, match_age: int | None, max_pages: int, expected: str, pages_read: int
) -> None:
    pi = stripe_fake.add_payment_intent(amount=10_000_000)
    started = int(time.time())
    if match_age is not None:  # the oldest refund, so the last of newest-first pages
        stripe_fake.add_refund(payment_intent=pi["id"], amount=777, created=started - 3)
    for _ in range(250 - (match_age is not None)):
        stripe_fake.add_refund(payment_intent=pi["id"], amount=1, created=started)
    stripe_fake.reset_counts()
    reconciler = StripeReconciler(stripe_fake.url, max_pages=max_pages)
    args = {"payment_intent": pi["id"], "amount": 777}
    assert reconciler(facts("stripe.refund", args, idempotency_key="no-such-key")) == expected
    assert stripe_fake.count("GET", "/v1/refunds") == pages_read
    assert {m for m, _ in stripe_fake.requests} == {"GET"}


def cancel_case(status: str) -> Callable[[FakeStripe], dict[str, Any]]:
    def seed(fake: FakeStripe) -> dict[str, Any]:
        pi = fake.add_payment_intent(status=status)
        return {"payment_intent": pi["id"]}

    return seed


def delete_case(deleted: bool) -> Callable[[FakeStripe], dict[str, Any]]:
    def seed(fake: FakeStripe) -> dict[str, Any]:
        customer = fake.add_customer(email="a@example.com")
        if deleted:
            with httpx.Client(trust_env=False) as client:
                url = f"{fake.url}/v1/customers/{customer['id']}"
                client.delete(url, headers={"Authorization": f"Bearer {KEY}"}).raise_for_status()
        return {"customer": customer["id"]}

    return seed


def payout_case(with_key: bool) -> Callable[[FakeStripe], dict[str, Any]]:
    def seed(fake: FakeStripe) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {KEY}", "Idempotency-Key": "other-key"}
        if with_key:
            headers["Idempotency-Key"] = ATTEMPT_KEY
        with httpx.Client(trust_env=False) as client:
            body = {"amount": "1000", "currency": "usd"}
            client.post(f"{fake.url}/v1/payouts", data=body, headers=headers).raise_for_status()
        return {"amount": 1000, "currency": "usd"}

    return seed


@pytest.mark.parametrize(
    ("action", "seed", "expected"),
    [
        ("stripe.cancel_payment_intent", cancel_case("canceled"), "committed"),
        ("stripe.cancel_payment_intent", cancel_case("requires_capture"), "not_executed"),
        ("stripe.cancel_payment_intent", lambda f: {"payment_intent": "pi_missing"}, "unknown"),
        ("stripe.delete_customer", delete_case(True), "committed"),
        ("stripe.delete_customer", delete_case(False), "not_executed"),
        ("stripe.payout", payout_case(True), "committed"),
        ("stripe.payout", payout_case(False), "unknown"),
        ("stripe.charge", lambda f: {"amount": 100, "currency": "usd"}, "unknown"),
        ("stripe.refund", lambda f: {"payment_id": "order-17"}, "unknown"),
        ("stripe.refund", lambda f: {"payment_intent": "pi_x", "amount": "5.5"}, "unknown"),
    ],
)
def test_other_actions(
    stripe_fake: FakeStripe,
    action: str,
    seed: Callable[[FakeStripe], dict[str, Any]],
    expected: str,
) -> None:
    arguments = seed(stripe_fake)
    stripe_fake.reset_counts()
    assert StripeReconciler(stripe_fake.url)(facts(action, arguments)) == expected
    assert {m for m, _ in stripe_fake.requests} <= {"GET"}
    assert stripe_fake.writes_applied == 0


FAILURES = ["500", "503", "unreachable", "timeout", "drop"]
QUESTIONS = [
    ("stripe.refund", lambda pi: {"payment_intent": pi["id"], "amount": 500}),
    ("stripe.cancel_payment_intent", lambda pi: {"payment_intent": pi["id"]}),
]


@pytest.mark.parametrize("failure", FAILURES)
@pytest.mark.parametrize(("action", "arguments"), QUESTIONS, ids=[q[0] for q in QUESTIONS])
def test_failures_are_unknown(
    stripe_fake: FakeStripe,
    closed_url: str,
    failure: str,
    action: str,
    arguments: Callable[[dict[str, Any]], dict[str, Any]],
) -> None:
    pi = stripe_fake.add_payment_intent(status="canceled")
    stripe_fake.hang_seconds = 5
    url = closed_url if failure == "unreachable" else stripe_fake.url
    if failure == "timeout":
        stripe_fake.fail_reads("hang")
    elif failure == "drop":
        stripe_fake.fail_reads("drop")
    elif failure.isdigit():
        stripe_fake.fail_reads(int(failure))
    began = time.monotonic()
    answer = StripeReconciler(url, timeout=0.5)(facts(action, arguments(pi)))
    assert answer == "unknown"
    assert time.monotonic() - began < 4


def test_the_deadline_bounds_a_whole_reconciliation(stripe_fake: FakeStripe) -> None:
    pi = stripe_fake.add_payment_intent(amount=10_000)
    stripe_fake.hang_seconds = 5
    stripe_fake.fail_reads("hang")
    reconciler = StripeReconciler(stripe_fake.url, timeout=0.5, deadline=0.8)
    began = time.monotonic()
    args = {"payment_intent": pi["id"], "amount": 500}
    assert reconciler(facts("stripe.refund", args)) == "unknown"
    assert time.monotonic() - began < 1.5  # events (0.5 s) + refunds (what is left: 0.3 s)


@pytest.mark.parametrize(
    ("credentials", "env", "expected"),
    [
        pytest.param(AUTH, None, "committed", id="the-request's-own-header"),
        pytest.param({"Authorization": f"Bearer {KEY}"}, None, "committed", id="header-case"),
        pytest.param({}, KEY, "committed", id="api_key_env"),
        pytest.param({}, None, "unknown", id="no-key-401"),
        pytest.param({}, "rk_live_wrong", "unknown", id="bad-key-401"),
    ],
)
def test_credentials(
    stripe_fake: FakeStripe,
    monkeypatch: pytest.MonkeyPatch,
    credentials: dict[str, str],
    env: str | None,
    expected: str,
) -> None:
    if env is None:
        monkeypatch.delenv("RECONCILER_TEST_STRIPE_KEY", raising=False)
    else:
        monkeypatch.setenv("RECONCILER_TEST_STRIPE_KEY", env)
    pi = stripe_fake.add_payment_intent(status="canceled")
    target = StripeTarget(stripe_fake.url, api_key_env="RECONCILER_TEST_STRIPE_KEY")
    reconciler = StripeReconciler.for_target(target)
    args = {"payment_intent": pi["id"]}
    answer = reconciler(facts("stripe.cancel_payment_intent", args, credentials=credentials))
    assert answer == expected
    assert KEY not in repr(reconciler)
    assert repr(reconciler) == f"StripeReconciler({stripe_fake.url!r})"


@pytest.mark.parametrize(("trusted", "expected"), [(True, "committed"), (False, "unknown")])
def test_tls_verifies_with_the_ca_file(trusted: bool, expected: str) -> None:
    with FakeStripe(tls=True) as fake:
        pi = fake.add_payment_intent(status="canceled")
        ca_file = str(fake.ca_file) if trusted else None
        reconciler = StripeReconciler(fake.url, ca_file=ca_file)
        answer = reconciler(facts("stripe.cancel_payment_intent", {"payment_intent": pi["id"]}))
        assert answer == expected


def test_an_unreadable_ca_file_is_unknown(stripe_fake: FakeStripe, tmp_path: Any) -> None:
    pi = stripe_fake.add_payment_intent(status="canceled")
    reconciler = StripeReconciler(stripe_fake.url, ca_file=str(tmp_path / "missing.pem"))
    answer = reconciler(facts("stripe.cancel_payment_intent", {"payment_intent": pi["id"]}))
    assert answer == "unknown"


@pytest.mark.parametrize(
    ("broken", "seeds", "expected"),
    [
        pytest.param(
            "/v1/refunds", [refund(500, key=ATTEMPT_KEY)], "committed", id="list-down-key"
        ),
        pytest.param("/v1/refunds", [refund(500)], "unknown", id="list-down-no-key"),
        pytest.param("/v1/events", [refund(500)], "committed", id="events-down-by-amount"),
        pytest.param(
            "/v1/events",
            [refund(500), refund(500, key=ATTEMPT_KEY)],
            "unknown",
            id="events-down-two",
        ),
    ],
)
def test_one_list_down(
    stripe_fake: FakeStripe, broken: str, seeds: list[Seed], expected: str
) -> None:
    pi = stripe_fake.add_payment_intent(amount=10_000)
    started = datetime.now(UTC)
    for seed in seeds:
        seed(stripe_fake, pi, int(started.timestamp()))
    stripe_fake.fail_reads(500, path=broken)
    args = {"payment_intent": pi["id"], "amount": 500}
    reconciler = StripeReconciler(stripe_fake.url)
    assert reconciler(facts("stripe.refund", args, attempt_started_at=started)) == expected


def test_no_refund_at_all_needs_no_events(stripe_fake: FakeStripe) -> None:
    pi = stripe_fake.add_payment_intent(amount=10_000)
    args = {"payment_intent": pi["id"], "amount": 500}
    assert StripeReconciler(stripe_fake.url)(facts("stripe.refund", args)) == "not_executed"
    # No account id among the arguments: the payment is looked for on the key's account too.
    assert stripe_fake.requests == [
        ("GET", "/v1/refunds"),
        ("GET", f"/v1/payment_intents/{pi['id']}"),
    ]


def test_nothing_found_too_early_is_unknown_not_not_executed(stripe_fake: FakeStripe) -> None:
    """A refund Stripe may still be working on must not be read as never having happened."""
    pi = stripe_fake.add_payment_intent(amount=5000)["id"]
    args = {"payment_intent": pi, "payment_id": pi, "amount": 1000}
    reconciler = StripeReconciler(stripe_fake.url, write_timeout=30, settle_margin=30)
    now = datetime.now(UTC)
    assert reconciler(facts("stripe.refund", args, attempt_started_at=now)) == "unknown"
    earlier = now - timedelta(seconds=120)
    assert reconciler(facts("stripe.refund", args, attempt_started_at=earlier)) == "not_executed"
    # Started long ago with no deadline (an SDK function), and it gave up only now: Stripe
    # may still be applying it.
    late = facts("stripe.refund", args, attempt_started_at=earlier, ended_at=now)
    assert StripeReconciler(stripe_fake.url, settle_margin=30)(late) == "unknown"


def test_a_target_reconciler_waits_out_the_write_deadline_and_the_margin() -> None:
    target = StripeTarget("http://127.0.0.1:1", timeout=90.0)
    reconciler = StripeReconciler.for_target(target)
    assert (reconciler.write_timeout, reconciler.settle_margin) == (90.0, SETTLE_MARGIN)


@pytest.mark.parametrize("offset", [-30, 30])
def test_a_stripe_clock_off_the_ledgers_answers_nothing_by_time(offset: int) -> None:
    """Stripe 30 s behind (or ahead of) the ledger: its ``created`` cannot be compared with the
    attempt's start, so neither "no refund since" nor "one refund since" stands."""
    with FakeStripe(clock=lambda: time.time() + offset) as fake:
        pi = fake.add_payment_intent(amount=5000)["id"]
        args = {"payment_intent": pi, "amount": 1000}
        started = datetime.now(UTC) - timedelta(minutes=5)
        asked = facts("stripe.refund", args, attempt_started_at=started, idempotency_key=None)
        reconciler = StripeReconciler(fake.url)
        assert reconciler(asked) == "unknown"
        fake.add_refund(payment_intent=pi, amount=1000)  # by amount only: a time-based match
        assert reconciler(asked) == "unknown"
        fake.add_refund(payment_intent=pi, amount=700, idempotency_key=ATTEMPT_KEY)
        # The attempt's own key in the events is proof whatever the clocks say.
        assert reconciler(replace(asked, idempotency_key=ATTEMPT_KEY)) == "committed"
    with FakeStripe() as fake:  # the same question with the clocks agreeing
        pi = fake.add_payment_intent(amount=5000)["id"]
        args = {"payment_intent": pi, "amount": 1000}
        asked = facts("stripe.refund", args, attempt_started_at=datetime.now(UTC))
        assert StripeReconciler(fake.url)(asked) == "not_executed"


def test_a_stripe_answer_without_a_date_proves_nothing_by_time(stripe_fake: FakeStripe) -> None:
    pi = stripe_fake.add_payment_intent(amount=5000)["id"]
    undated = httpx.HTTPTransport()

    class NoDate(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = undated.handle_request(request)
            response.read()
            del response.headers["date"]
            return response

    reconciler = StripeReconciler(stripe_fake.url, transport=NoDate())
    assert reconciler(facts("stripe.refund", {"payment_intent": pi})) == "unknown"
