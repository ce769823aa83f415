"""Must-hold: a budget of 1,000 over four sidecars on one PostgreSQL, eight agents racing.

Four real ``ctrlrun proxy`` processes share one PostgreSQL ledger and one fake Stripe. Eight
threads (the agents) each send 20 refunds of 10 (1,600 asked) spread over the sidecars at
once. The budget row is spent in each reservation's own transaction, so the remote receives
at most 1,000 in sum, and every refused request says ``budget_exceeded``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from e2e.harness import POLICY, Sidecar

from ctrlrun.testing import FakeKubernetes, FakeStripe

AUTH = {"Authorization": "Bearer sk_test_budgets"}
AGENTS, EACH, AMOUNT, LIMIT = 8, 20, 10, 1000
BUDGETED = POLICY.replace(
    "      - decision: approve\n",
    "      - decision: approve\n    budget: {{sum: amount, max: 1000, per: 1d, by: everyone}}\n",
    1,
)


@pytest.mark.slow
def test_four_sidecars_on_one_postgres_never_spend_past_the_budget(
    pg_url: str, fakes: tuple[FakeStripe, FakeKubernetes], sidecars: Callable[..., Sidecar]
) -> None:
    assert BUDGETED != POLICY
    stripe, kube = fakes
    four = [sidecars(stripe, kube, store_url=pg_url, policy_text=BUDGETED) for _ in range(4)]
    payments = [[f"pi_b{a}_{i}" for i in range(EACH)] for a in range(AGENTS)]
    for row in payments:
        for pi in row:
            stripe.add_payment_intent(pi, amount=1000)
    start = threading.Barrier(AGENTS)

    def agent(a: int) -> list[tuple[int, str, str]]:
        answers = []
        start.wait(timeout=30)
        with httpx.Client(timeout=30) as client:
            for i, pi in enumerate(payments[a]):
                sc = four[(a + i) % len(four)]
                r = client.post(
                    f"{sc.stripe_base}/v1/refunds",
                    data={"payment_intent": pi, "amount": str(AMOUNT)},
                    headers=AUTH,
                )
                answers.append((r.status_code, r.headers.get("X-Ctrlrun-Outcome", ""), r.text))
        return answers

    with ThreadPoolExecutor(AGENTS) as pool:
        results = [answer for answers in pool.map(agent, range(AGENTS)) for answer in answers]
    refunded = sum(int(r["amount"]) for r in stripe.refunds)
    assert refunded <= LIMIT
    ok = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] != 200]
    assert len(ok) * AMOUNT == refunded
    assert len(ok) + len(refused) == AGENTS * EACH
    assert refused, "1,600 was asked of a budget of 1,000"
    for status, outcome, text in refused:
        assert (status, outcome) == (403, "budget_exceeded"), text
        assert "budget_exceeded" in text or "budget exceeded" in text
    # Nothing was lost on the way: the budget is spent to the last 10.
    assert refunded == LIMIT
    # A refund without an amount refunds whatever remains: it is refused (the sidecar will not
    # forward a refund it cannot measure, or the budget cannot measure it), however it names
    # the payment, and nothing more reaches the remote.
    stripe.add_payment_intent("pi_whole", amount=1000)
    for data in ({"payment_intent": "pi_whole"}, {"charge": "pi_whole"}):
        r = httpx.post(f"{four[1].stripe_base}/v1/refunds", data=data, headers=AUTH, timeout=10)
        outcome = r.headers.get("X-Ctrlrun-Outcome")
        assert outcome in ("invalid_request", "budget_exceeded") and r.status_code >= 400, r.text
    assert sum(int(r["amount"]) for r in stripe.refunds) == LIMIT
    said = four[0].cli("budgets", "--policy", str(four[0].policy), "--store-url", pg_url)
    assert said.returncode == 0, said.stderr
    assert "stripe.refund  *  spent 1000, left 0 of 1000" in said.stdout
