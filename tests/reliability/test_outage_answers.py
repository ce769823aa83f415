"""During a ledger outage every protected request gets one clear ``unavailable`` answer.

stripe-python sends an ``Idempotency-Key`` on every write; the proxy's same-key replay check
reads the ledger before admission, and an outage there must answer like any other: "the ledger
cannot be reached; nothing was sent", one log line when the ledger goes away and one when it
comes back, not one (with a traceback) per request.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import stripe
from e2e.harness import STRIPE_KEY, Sidecar

from ctrlrun.testing import FakeKubernetes, FakeStripe

from .test_store_outage import outage

REQUESTS = 120  # bounded: a few seconds of agents retrying into the outage
AGENTS = 4  # concurrent clients


def stripe_client(base: str) -> stripe.StripeClient:
    """The official client, retries off: each request is one answer to count."""
    http = stripe.RequestsClient(timeout=15, proxy=None)
    return stripe.StripeClient(
        STRIPE_KEY, base_addresses={"api": base}, max_network_retries=0, http_client=http
    )


def refund(client: stripe.StripeClient, payment_intent: str, amount: int) -> object:
    return client.v1.refunds.create(params={"payment_intent": payment_intent, "amount": amount})


def answer_of(call: Callable[[], object]) -> tuple[str, str]:
    try:
        call()
    except stripe.StripeError as err:
        body = err.json_body or {}
        block = body.get("ctrlrun", {})
        return str(block.get("outcome", err.http_status)), str(block.get("reason", ""))
    return "forwarded", ""


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_outage_under_stripe_python_is_one_clear_answer(
    pg_url: str, fakes: tuple[FakeStripe, FakeKubernetes], sidecars: Callable[..., Sidecar]
) -> None:
    fake_stripe, kube = fakes
    pis = [fake_stripe.add_payment_intent(amount=5000)["id"] for _ in range(REQUESTS + 2)]
    sc = sidecars(fake_stripe, kube, store_url=pg_url, reconcile="off", timeout=5, admin=True)
    client = stripe_client(sc.stripe_base)
    refund(client, pis[0], 100)  # the pool holds live connections now
    before = fake_stripe.count("POST", "/v1/refunds")
    lines_before = len(sc.log.read_text().splitlines())
    started = time.monotonic()
    with outage(pg_url):
        with ThreadPoolExecutor(AGENTS) as pool:
            sent = pool.map(
                lambda i: answer_of(lambda: refund(client, pis[1 + i], 100)), range(REQUESTS)
            )
            answers = Counter(sent)
        during = fake_stripe.count("POST", "/v1/refunds") - before
    elapsed = time.monotonic() - started
    after = answer_of(lambda: refund(client, pis[-1], 100))
    log_lines = sc.log.read_text().splitlines()[lines_before:]
    tracebacks = sum("Traceback" in line for line in log_lines)
    metrics = httpx.get(f"{sc.admin_url}/metrics", timeout=10).text
    for line in log_lines:
        print("  log:", line[:160])
    print(
        f"outage: requests={REQUESTS} in {elapsed:.1f}s answers={dict(answers)} "
        f"forwarded={during} log_lines={len(log_lines)} tracebacks={tracebacks} after={after}"
    )
    assert answers == Counter({("unavailable", "store_unavailable"): REQUESTS})
    assert during == 0
    assert tracebacks == 0
    # Two state changes (down, back up): fewer lines than twice that, whatever the load.
    assert len(log_lines) < 4, log_lines
    assert after == ("forwarded", "")
    assert "ctrlrun_ledger_available 1.0" in metrics
    assert f"ctrlrun_store_errors_total {float(REQUESTS)}" in metrics
