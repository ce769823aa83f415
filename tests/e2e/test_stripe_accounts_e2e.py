"""Connected accounts bind (issue 10, must-hold 4): ``Stripe-Account`` is the ``account``
argument of every Stripe action, so it is in the action hash an approval is granted for, in
the effect key, in conditions, and in what ``ctrlrun approvals``, ``inspect`` and receipts show.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import stripe
from harness import POLICY, STRIPE_KEY, Sidecar, running_sidecar
from stripe_support import CLIENT_TIMEOUT, ctrlrun_block, outcome, receipts_for, refused
from stripe_support import stripe_client as client_for

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(120)
BIG = 150_000  # over the harness policy's 100000: stripe.refund needs approval
ACCOUNT_POLICY = POLICY.replace(
    '    effect: "refund:{{payment_id}}"\n    rules:\n',
    '    effect: "refund:{{account}}:{{payment_id}}"\n    rules:\n'
    "      - when: {{account_eq: acct_frozen}}\n        decision: deny\n",
)
assert ACCOUNT_POLICY != POLICY


@pytest.fixture(scope="module")
def remotes() -> Iterator[tuple[FakeStripe, FakeKubernetes]]:
    with FakeStripe() as fake, FakeKubernetes() as kube:
        for acct in ("acct_A", "acct_B", "acct_frozen"):
            fake.add_account(acct)
        yield fake, kube


@pytest.fixture
def sc(tmp_path: Path, remotes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[Sidecar]:
    with running_sidecar(
        tmp_path, *remotes, policy_text=ACCOUNT_POLICY, reconcile="off", in_process=True
    ) as sidecar:
        yield sidecar


@pytest.fixture
def fake(remotes: tuple[FakeStripe, FakeKubernetes]) -> FakeStripe:
    remotes[0].fail_next(None)
    return remotes[0]


def refund(sc: Sidecar, pi: str, amount: int, account: str | None, **headers: str) -> Any:
    options: dict[str, Any] = {"headers": headers} if headers else {}
    if account:
        options["stripe_account"] = account
    params = {"payment_intent": pi, "amount": amount}
    return client_for(sc.stripe_base).v1.refunds.create(params=params, options=options)  # type: ignore[arg-type]


def test_an_approval_for_one_account_is_refused_for_another(sc: Sidecar, fake: FakeStripe) -> None:
    # The same payment id on both accounts: only the account tells the two refunds apart.
    pa = fake.add_payment_intent("pi_shared_1", amount=500_000, account="acct_A")["id"]
    fake.add_payment_intent("pi_shared_1", amount=500_000, account="acct_B")
    err = refused(lambda: refund(sc, pa, BIG, "acct_A"))
    request_id = ctrlrun_block(err)["request_id"]

    listed = sc.cli("approvals", "--json", "--store-url", sc.store_url)
    [pending] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert pending["action"]["arguments"]["account"] == "acct_A"
    shown = sc.cli("approvals", "--store-url", sc.store_url).stdout
    assert '"account": "acct_A"' in shown
    assert sc.cli("approve", request_id, "--store-url", sc.store_url).returncode == 0

    other = refused(lambda: refund(sc, pa, BIG, "acct_B", **{"Ctrlrun-Approval": request_id}))

    assert other.http_status == 403 and outcome(other) == "approval_invalid"
    assert fake.refunds_in("acct_B") == [] and fake.refunds_in("acct_A") == []

    done = refund(sc, pa, BIG, "acct_A", **{"Ctrlrun-Approval": request_id})

    assert done.amount == BIG and [r["amount"] for r in fake.refunds_in("acct_A")] == [BIG]
    [committed] = [r for r in receipts_for(sc, f"refund:acct_A:{pa}") if r["result"] == "committed"]
    assert committed["arguments"]["account"] == "acct_A"
    inspected = sc.cli("inspect", committed["action_id"], "--store-url", sc.store_url)
    assert '"account": "acct_A"' in inspected.stdout, inspected.stdout


def test_the_account_is_part_of_the_effect_key(sc: Sidecar, fake: FakeStripe) -> None:
    pa = fake.add_payment_intent("pi_shared_2", amount=5000, account="acct_A")["id"]
    fake.add_payment_intent("pi_shared_2", amount=5000, account="acct_B")
    own = fake.add_payment_intent(amount=5000)["id"]

    refund(sc, pa, 100, "acct_A")
    refund(sc, pa, 100, "acct_B")  # another account's payment: another effect
    refund(sc, own, 100, None)
    again = refused(lambda: refund(sc, pa, 100, "acct_A"))

    assert again.http_status == 409 and outcome(again) == "duplicate"
    assert sc.effect_state(f"refund:acct_A:{pa}") == "committed"
    assert sc.effect_state(f"refund:acct_B:{pa}") == "committed"
    assert sc.effect_state(f"refund:{fake.platform_id}:{own}") == "committed"
    for acct in ("acct_A", "acct_B"):
        assert [r["payment_intent"] for r in fake.refunds_in(acct)].count(pa) == 1


def test_a_condition_reads_the_account(sc: Sidecar, fake: FakeStripe) -> None:
    pi = fake.add_payment_intent(amount=5000, account="acct_frozen")["id"]
    err = refused(lambda: refund(sc, pi, 100, "acct_frozen"))
    assert err.http_status == 403 and outcome(err) == "denied"
    assert fake.refunds_in("acct_frozen") == []


@pytest.mark.parametrize(
    "headers",
    [
        [("Stripe-Account", "acct_A"), ("Stripe-Account", "acct_B")],
        [("Stripe-Account", "not-an-account")],
        [("Stripe-Context", "ctx_1")],
    ],
)
def test_an_account_ctrlrun_cannot_read_with_certainty_is_refused(
    sc: Sidecar, fake: FakeStripe, headers: list[tuple[str, str]]
) -> None:
    pi = fake.add_payment_intent(amount=5000, account="acct_A")["id"]
    before = len(fake.requests)
    with httpx.Client(base_url=sc.stripe_base, timeout=CLIENT_TIMEOUT, trust_env=False) as http:
        answer = http.post(
            "/v1/refunds",
            content=f"payment_intent={pi}&amount=100".encode(),
            headers=[
                ("Authorization", f"Bearer {STRIPE_KEY}"),
                ("Content-Type", "application/x-www-form-urlencoded"),
                *headers,
            ],
        )
    assert answer.status_code == 400 and answer.headers["X-Ctrlrun-Outcome"] == "invalid_request"
    assert len(fake.requests) == before  # nothing reached the fake


def test_stripe_python_names_the_account_it_acts_on(sc: Sidecar, fake: FakeStripe) -> None:
    pi = fake.add_payment_intent(amount=5000, account="acct_B")["id"]
    with pytest.raises(stripe.PermissionError):
        refund(sc, pi, 100, "acct_nobody")  # the fake refuses an account it does not know
    assert sc.effect_state(f"refund:acct_nobody:{pi}") == "failed"
