"""A budget with ``over: approve`` through the sidecar: past the limit the official stripe client
hears ``approval_required``; two operators approve (a quorum) and the identical refund re-sent
goes through, spending past the limit; nothing reaches Stripe before that."""

from __future__ import annotations

from pathlib import Path

import pytest
import stripe
from harness import POLICY, running_sidecar
from stripe_support import ctrlrun_block, receipts_for, refund, refused, stripe_client

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(120)
OVER_APPROVE = (
    POLICY.replace(
        """    rules:
      - when: {{amount_lte: 100000}}
        decision: allow
      - decision: approve
""",
        """    decision: allow
    approvals_required: 2
    budget: {{sum: amount, max: 1000, per: 1d, by: everyone, over: approve}}
""",
        1,
    )
    + "operators:\n  alice: {{token_env: OPERATOR_ALICE}}\n  bob: {{token_env: OPERATOR_BOB}}\n"
)


def test_past_the_budget_a_quorum_approves_and_the_resent_refund_spends_past_it(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    assert OVER_APPROVE != POLICY
    fake, kube = fakes
    with running_sidecar(
        tmp_path, fake, kube, policy_text=OVER_APPROVE, reconcile="off", in_process=True
    ) as sc:
        client = stripe_client(sc.stripe_base)
        first = fake.add_payment_intent(amount=5000)["id"]
        second = fake.add_payment_intent(amount=5000)["id"]
        refund(client, first, 1000)  # the whole budget
        err = refused(lambda: refund(client, second, 10))
        assert isinstance(err, stripe.PermissionError) and err.http_status == 403
        block = ctrlrun_block(err)
        assert block["outcome"] == "approval_required"
        request_id = str(block["request_id"])
        assert sum(int(r["amount"]) for r in fake.refunds) == 1000  # nothing more sent

        url = ("--store-url", sc.store_url)
        alice = sc.cli("approve", request_id, "--as", "alice", *url)
        assert alice.returncode == 0, alice.stderr
        assert "1 of 2 approvals; waiting for another operator" in alice.stdout
        bob = sc.cli("approve", request_id, "--as", "bob", *url)
        assert bob.returncode == 0, bob.stderr
        assert "by alice, bob" in bob.stdout

        refund(client, second, 10)  # the identical request, re-sent: it goes through
        assert sum(int(r["amount"]) for r in fake.refunds) == 1010  # past the limit, approved
        (doc,) = [d for d in receipts_for(sc, f"refund:{second}") if d["result"] == "committed"]
        assert doc["approval_id"] == request_id and doc["approver"] == "alice, bob"
        left = sc.cli("budgets", "--policy", str(sc.policy), *url)
        assert left.returncode == 0, left.stderr
        assert "stripe.refund  *  spent 1010, left 0 of 1000" in left.stdout


def test_past_the_budget_the_approval_queue_cap_holds_and_under_it_nothing_waits(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    capped = OVER_APPROVE.replace("    approvals_required: 2\n", "", 1)
    capped += "limits: {{pending_approvals_per_agent: 1}}\n"
    fake, kube = fakes
    with running_sidecar(
        tmp_path, fake, kube, policy_text=capped, reconcile="off", in_process=True
    ) as sc:
        client = stripe_client(sc.stripe_base)
        pis = [fake.add_payment_intent(amount=5000)["id"] for _ in range(4)]
        refund(client, pis[0], 990)
        asked = ctrlrun_block(refused(lambda: refund(client, pis[1], 20)))
        assert asked["outcome"] == "approval_required"
        refund(client, pis[2], 10)  # under the budget: a full queue holds nothing back
        full = ctrlrun_block(refused(lambda: refund(client, pis[3], 10)))
        assert (full["outcome"], full["reason"]) == ("denied", "approval_queue_full")
        assert sum(int(r["amount"]) for r in fake.refunds) == 1000
