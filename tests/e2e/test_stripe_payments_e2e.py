"""One payment, one effect (issue 10, must-hold 2): a refund by payment intent, by its charge,
and through each legacy charge endpoint is one refund at the fake, the others refused as
duplicates; a refund without an amount is refused where the policy reads the amount."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import stripe
from harness import POLICY, Sidecar, running_sidecar
from stripe_support import ctrlrun_block, outcome, refused, stripe_client

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(120)
Refund = Callable[[stripe.StripeClient, str, str, dict[str, Any]], object]


@pytest.fixture(scope="module")
def remotes() -> Iterator[tuple[FakeStripe, FakeKubernetes]]:
    with FakeStripe() as fake, FakeKubernetes() as kube:
        fake.add_account("acct_P")
        yield fake, kube


@pytest.fixture
def sc(tmp_path: Path, remotes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[Sidecar]:
    with running_sidecar(tmp_path, *remotes, reconcile="off", in_process=True) as sidecar:
        yield sidecar


@pytest.fixture
def fake(remotes: tuple[FakeStripe, FakeKubernetes]) -> FakeStripe:
    remotes[0].fail_next(None)
    remotes[0].fail_reads(None)
    return remotes[0]


def by_payment_intent(c: stripe.StripeClient, pi: str, ch: str, o: dict[str, Any]) -> object:
    return c.v1.refunds.create(params={"payment_intent": pi, "amount": 100}, options=o)  # type: ignore[arg-type]


def by_charge(c: stripe.StripeClient, pi: str, ch: str, o: dict[str, Any]) -> object:
    return c.v1.refunds.create(params={"charge": ch, "amount": 100}, options=o)  # type: ignore[arg-type]


def legacy_refund(c: stripe.StripeClient, pi: str, ch: str, o: dict[str, Any]) -> object:
    return c.raw_request("post", f"/v1/charges/{ch}/refund", amount=100, **o)


def legacy_refunds(c: stripe.StripeClient, pi: str, ch: str, o: dict[str, Any]) -> object:
    return c.raw_request("post", f"/v1/charges/{ch}/refunds", amount=100, **o)


ALIASES = [by_payment_intent, by_charge, legacy_refund, legacy_refunds]


@pytest.mark.parametrize("first", ALIASES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("account", [None, "acct_P"])
def test_every_alias_of_a_payment_is_one_refund(
    sc: Sidecar, fake: FakeStripe, first: Refund, account: str | None
) -> None:
    pi = fake.add_payment_intent(amount=5000, account=account)
    ch = pi["latest_charge"]
    client = stripe_client(sc.stripe_base, retries=0)
    options = {"stripe_account": account} if account else {}

    first(client, pi["id"], ch, options)

    for other in ALIASES:
        err = refused(lambda other=other: other(client, pi["id"], ch, options))  # type: ignore[misc]
        assert err.http_status == 409 and outcome(err) == "duplicate", other.__name__
    made = [r for r in fake.refunds_in(account) if r["payment_intent"] == pi["id"]]
    assert [r["amount"] for r in made] == [100]
    assert sc.effect_state(f"refund:{pi['id']}") == "committed"


def test_a_charge_without_a_payment_intent_is_its_own_payment(
    sc: Sidecar, fake: FakeStripe
) -> None:
    ch = fake.add_charge(amount=5000)["id"]
    client = stripe_client(sc.stripe_base, retries=0)

    legacy_refund(client, "", ch, {})
    err = refused(lambda: by_charge(client, "", ch, {}))

    assert outcome(err) == "duplicate" and sc.effect_state(f"refund:{ch}") == "committed"
    assert [r["amount"] for r in fake.refunds if r["charge"] == ch] == [100]


def test_a_charge_stripe_does_not_know_is_refused_and_nothing_sent(
    sc: Sidecar, fake: FakeStripe
) -> None:
    posts = fake.count("POST")
    err = refused(lambda: by_charge(stripe_client(sc.stripe_base, retries=0), "", "ch_nope", {}))

    assert err.http_status == 400
    block = ctrlrun_block(err)
    assert (block["outcome"], block["reason"]) == ("invalid_request", "payment_unresolved")
    assert "HTTP 404" in str(err) and fake.count("POST") == posts


def test_when_stripe_cannot_say_which_payment_nothing_is_sent(
    sc: Sidecar, fake: FakeStripe
) -> None:
    pi = fake.add_payment_intent(amount=5000)
    posts = fake.count("POST")
    fake.fail_reads(500, path="/v1/charges/")

    err = refused(
        lambda: by_charge(stripe_client(sc.stripe_base, retries=0), "", pi["latest_charge"], {})
    )

    assert err.http_status == 503 and ctrlrun_block(err)["reason"] == "payment_unresolved"
    assert fake.count("POST") == posts and sc.effect_state(f"refund:{pi['id']}") is None


@pytest.mark.parametrize("alias", ["payment_intent", "charge", "legacy"])
def test_a_refund_without_an_amount_is_refused_where_the_policy_reads_it(
    sc: Sidecar, fake: FakeStripe, alias: str
) -> None:
    pi = fake.add_payment_intent(amount=500_000)
    client = stripe_client(sc.stripe_base, retries=0)
    posts = fake.count("POST")
    send = {
        "payment_intent": lambda: client.v1.refunds.create(params={"payment_intent": pi["id"]}),
        "charge": lambda: client.v1.refunds.create(params={"charge": pi["latest_charge"]}),
        "legacy": lambda: client.raw_request("post", f"/v1/charges/{pi['latest_charge']}/refund"),
    }[alias]

    err = refused(send)

    assert err.http_status == 400
    assert ctrlrun_block(err)["reason"] == "amount_required"
    assert fake.count("POST") == posts and fake.refunds_in(None) == [
        r for r in fake.refunds if r["payment_intent"] != pi["id"]
    ]


def test_a_refund_without_an_amount_passes_a_policy_that_does_not_read_it(
    tmp_path: Path, remotes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    text = POLICY.replace(
        "      - when: {{amount_lte: 100000}}\n        decision: allow\n"
        "      - decision: approve\n",
        "      - decision: allow\n",
        1,
    )
    assert text != POLICY
    fake = remotes[0]
    pi = fake.add_payment_intent(amount=7000)
    with running_sidecar(
        tmp_path, *remotes, policy_text=text, reconcile="off", in_process=True
    ) as sc:
        done = stripe_client(sc.stripe_base).v1.refunds.create(
            params={"charge": pi["latest_charge"]}
        )
        assert done.amount == 7000 and sc.effect_state(f"refund:{pi['id']}") == "committed"
