"""The SDK factories: reading arguments back out of effect keys, and hooks on the real fakes."""

from __future__ import annotations

import doctest
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

import ctrlrun
from ctrlrun import Control, DuplicateEffect, InvalidArgument, Policy, SQLiteStateStore
from ctrlrun.context import idempotency_token_for
from ctrlrun.ledger import get_effect
from ctrlrun.reconcile import EffectFacts
from ctrlrun.reconcilers import (
    kubernetes_deletes,
    kubernetes_scale,
    parse_effect_key,
    stripe_payment_intent_cancels,
    stripe_refunds,
)
from ctrlrun.states import EffectState
from ctrlrun.templates import parse_template
from ctrlrun.testing import FakeKubernetes, FakeStripe

KEY = "sk_test_factories"


@pytest.mark.parametrize(
    ("template", "key", "ints", "expected"),
    [
        ("refund:{payment_id}", "refund:pi_123", (), {"payment_id": "pi_123"}),
        ("refund:{payment_id}", "refund:a:b", (), {"payment_id": "a:b"}),
        ("refund:{payment_id}", "refund:", (), None),
        ("refund:{payment_id}", "charge:pi_1", (), None),
        (
            "scale:{cluster}:{deployment}:{replicas}",
            "scale:eu:web:6",
            ("replicas",),
            {"cluster": "eu", "deployment": "web", "replicas": 6},
        ),
        ("scale:{cluster}:{deployment}:{replicas}", "scale:eu:web:six", ("replicas",), None),
        ("scale:{cluster}:{deployment}:{replicas}", "scale:eu:1:web:6", ("replicas",), None),
        (
            "scale:{cluster}:{deployment}:{replicas}",
            "scale:eu:web:6",
            (),
            {"cluster": "eu", "deployment": "web", "replicas": "6"},
        ),
        ("{a}-{b}.json", "x-y.json", (), {"a": "x", "b": "y"}),
        ("{a}-{b}.json", "x-y-z.json", (), None),  # which dash? ambiguous
        ("{a}{b}", "xy", (), {"a": "x", "b": "y"}),  # adjacent, but only one cut
        ("{a}{b}", "xyz", (), None),  # adjacent placeholders: ambiguous
        ("{a}{b}", "x", (), None),
        ("{a}:{a}", "x:x", (), {"a": "x"}),
        ("{a}:{a}", "x:y", (), None),
        ("fixed", "fixed", (), {}),
        ("fixed", "other", (), None),
        ("r:{amount}", "r:٣", ("amount",), None),  # a non-ASCII digit is no amount
    ],
)
def test_parse_effect_key(
    template: str, key: str, ints: tuple[str, ...], expected: dict[str, Any] | None
) -> None:
    parsed = parse_effect_key(parse_template(template), key, ints=ints)
    assert parsed == expected
    if parsed is not None:  # the inverse really inverts
        assert parse_template(template).resolve(parsed) == key


def test_parse_effect_key_is_not_exponential() -> None:
    template = parse_template("{a}:{b}:{c}:{d}:{e}!")
    assert parse_effect_key(template, ":".join(["x"] * 400)) is None


@pytest.mark.parametrize(
    ("factory", "kwargs", "message"),
    [
        (stripe_refunds, {"api_key": KEY, "effect": "refund:{order}"}, "payment_id"),
        (stripe_refunds, {"api_key": KEY, "effect": "refund:{payment_id"}, "template"),
        (stripe_payment_intent_cancels, {"api_key": KEY, "effect": "c:{x}"}, "payment_intent"),
        (kubernetes_scale, {"server": "http://k", "effect": "s:{deployment}"}, "replicas"),
        (kubernetes_deletes, {"server": "http://k", "effect": "d:{cluster}"}, "deployment"),
    ],
)
def test_factories_refuse_templates_they_cannot_read(
    factory: Any, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        factory(**kwargs)


def test_stripe_refunds_hook(stripe_fake: FakeStripe) -> None:
    pi = stripe_fake.add_payment_intent(amount=5000)
    hook = stripe_refunds(api_key=KEY, base_url=stripe_fake.url, amount=500)
    assert hook(f"refund:{pi['id']}") == "not_executed"
    stripe_fake.add_refund(payment_intent=pi["id"], amount=500)
    assert hook(f"refund:{pi['id']}") == "committed"
    assert hook("not-a-refund-key") == "unknown"
    by_amount = stripe_refunds(
        api_key=KEY, base_url=stripe_fake.url, effect="refund:{payment_intent}:{amount}"
    )
    assert by_amount(f"refund:{pi['id']}:500") == "committed"
    assert by_amount(f"refund:{pi['id']}:700") == "not_executed"
    assert {m for m, _ in stripe_fake.requests} == {"GET"}


def test_stripe_payment_intent_cancels_hook(stripe_fake: FakeStripe, closed_url: str) -> None:
    canceled = stripe_fake.add_payment_intent(status="canceled")
    live = stripe_fake.add_payment_intent(status="requires_capture")
    hook = stripe_payment_intent_cancels(api_key=KEY, base_url=stripe_fake.url)
    assert hook(f"cancel:{canceled['id']}") == "committed"
    assert hook(f"cancel:{live['id']}") == "not_executed"
    down = stripe_payment_intent_cancels(api_key=KEY, base_url=closed_url)
    assert down(f"cancel:{canceled['id']}") == "unknown"


def test_kubernetes_hooks(kube_fake: FakeKubernetes) -> None:
    kube_fake.add_deployment("prod", "web", 6)
    kube_fake.add_namespace("shop")
    scale = kubernetes_scale(server=kube_fake.url, token="t", namespace="prod")
    assert scale("scale:eu:web:6") == "committed"
    assert scale("scale:eu:web:3") == "not_executed"
    assert scale("scale:eu:web:lots") == "unknown"
    deletes = kubernetes_deletes(server=kube_fake.url, token="t")
    assert deletes("delete:eu:prod:web") == "not_executed"
    assert deletes("delete:eu:prod:gone") == "committed"
    namespaces = kubernetes_deletes(server=kube_fake.url, effect="drop:{cluster}:{name}")
    assert namespaces("drop:eu:shop") == "not_executed"
    assert namespaces("drop:eu:nothing") == "committed"
    assert kube_fake.writes_applied == 0


POLICY = """\
schema: ctrlrun.policy/v2
actions:
  refund:
    effect: "refund:{payment_id}"
    decision: allow
"""


@pytest.fixture
def control(tmp_path: Path) -> Iterator[Control]:
    store = SQLiteStateStore(tmp_path / "state.db")
    yield Control(Policy.from_yaml(POLICY), store)
    store.close()


def test_round_trip_through_protect(stripe_fake: FakeStripe, control: Control) -> None:
    """The reply of a real refund is lost; the eager hook finds it; the retry is refused."""
    pi = stripe_fake.add_payment_intent(amount=5000)

    @ctrlrun.protect(
        "refund",
        effect="refund:{payment_id}",
        reconcile=stripe_refunds(api_key=KEY, base_url=stripe_fake.url, amount=500),
        reconcile_eagerly=True,
        control=control,
    )
    def refund(payment_id: str, amount: int) -> str:
        with httpx.Client(trust_env=False, timeout=5) as client:
            response = client.post(
                f"{stripe_fake.url}/v1/refunds",
                data={"payment_intent": payment_id, "amount": str(amount)},
                headers={
                    "Authorization": f"Bearer {KEY}",
                    "Idempotency-Key": ctrlrun.idempotency_token(),
                },
            )
        response.raise_for_status()
        return str(response.json()["id"])

    stripe_fake.fail_next("commit_then_drop")
    with ctrlrun.context(agent="refund-bot"):
        with pytest.raises(httpx.TransportError):
            refund(pi["id"], 500)
        with control.store.reading() as conn:
            record = get_effect(conn, f"refund:{pi['id']}")
        assert record is not None and record.state is EffectState.COMMITTED
        with pytest.raises(DuplicateEffect) as refused:
            refund(pi["id"], 500)
    assert refused.value.state == "committed"
    assert stripe_fake.writes_applied == 1
    assert stripe_fake.count("POST") == 1
    assert len(stripe_fake.refunds) == 1


def test_the_docstring_examples_run() -> None:
    from ctrlrun.reconcilers import factories

    result = doctest.testmod(factories)
    assert result.attempted >= 4
    assert result.failed == 0


def test_the_kernel_gives_a_hook_the_attempts_facts(stripe_fake: FakeStripe) -> None:
    """Asked with the attempt's facts, a hook reads the call's arguments, looks for that one
    attempt's token, and says nothing is there only once its settle window is over."""
    pi = stripe_fake.add_payment_intent(amount=5000)["id"]
    key = f"refund:{pi}"
    hook = stripe_refunds(api_key=KEY, base_url=stripe_fake.url, settle=timedelta(seconds=30))
    now = datetime.now(UTC)
    args = {"payment_id": pi, "amount": 500}
    # It gave up 20 s ago: Stripe may still be working on it for 10 s more.
    recent = EffectFacts(
        key,
        "refund",
        args,
        now - timedelta(seconds=60),
        attempt=2,
        ended_at=now - timedelta(seconds=20),
    )
    settled = replace(recent, ended_at=now - timedelta(seconds=40))
    stripe_fake.add_refund(payment_intent=pi, amount=700)  # another amount: not this one
    assert hook.reconcile_attempt(recent) == "unknown"
    assert hook.reconcile_attempt(settled) == "not_executed"
    token = idempotency_token_for(key, 2)
    stripe_fake.add_refund(payment_intent=pi, amount=500, idempotency_key=token)
    assert hook.reconcile_attempt(recent) == "committed"  # its own token: no window needed
    assert hook(key) == "committed"  # a bare key still works (any attempt's token)
