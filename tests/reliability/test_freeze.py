"""The kill switch: ``ctrlrun freeze`` stops every sidecar and SDK process on one ledger.

Two real ``ctrlrun proxy`` processes and this process's ``@protect`` share one PostgreSQL
ledger. After ``ctrlrun freeze`` returns, within one second every protected write is refused
with outcome ``frozen`` and nothing reaches the remote; reads flow; ``/readyz`` stays ready;
``ctrlrun unfreeze`` restores them; both acts are receipts naming the operator.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from e2e.harness import Sidecar
from e2e.harness import clean_env as env

from ctrlrun import ActionFrozen, Control, Policy, context, protect
from ctrlrun.store import open_store
from ctrlrun.testing import FakeKubernetes, FakeStripe

AUTH = {"Authorization": "Bearer sk_test_freeze"}
SPREAD = 1.0  # the promise: a freeze reaches every process within a second
SDK_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  wire.send:
    effect: "wire:{wire_id}"
    decision: allow
"""


def refund(sc: Sidecar, payment: str, stripe: FakeStripe) -> httpx.Response:
    stripe.add_payment_intent(payment)
    return httpx.post(
        f"{sc.stripe_base}/v1/refunds",
        data={"payment_intent": payment, "amount": "100"},
        headers=AUTH,
        timeout=10,
    )


def cli(sc: Sidecar, *args: str) -> str:
    ran = sc.cli(*args, "--store-url", sc.store_url)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


@pytest.mark.slow
def test_freeze_stops_every_sidecar_and_the_sdk_within_a_second(
    pg_url: str,
    fakes: tuple[FakeStripe, FakeKubernetes],
    sidecars: Callable[..., Sidecar],
    tmp_path: Path,
) -> None:
    stripe, kube = fakes
    pair = [sidecars(stripe, kube, store_url=pg_url, admin=True) for _ in range(2)]
    store = open_store(pg_url)
    sent: list[str] = []

    @protect("wire.send", control=Control(Policy.from_yaml(SDK_POLICY), store))
    def send(wire_id: str) -> str:
        sent.append(wire_id)
        return wire_id

    for i, sc in enumerate(pair):
        assert refund(sc, f"pi_before_{i}", stripe).status_code == 200
    with context("sdk-agent"):
        send("w0")

    said = cli(pair[0], "freeze", "--reason", "refund loop INC-1", "--as", "alice")
    assert said.startswith("frozen: every action is frozen by alice: refund loop INC-1")
    time.sleep(SPREAD)
    before = len(stripe.refunds)
    for i, sc in enumerate(pair):
        r = refund(sc, f"pi_frozen_{i}", stripe)
        assert (r.status_code, r.headers["X-Ctrlrun-Outcome"]) == (403, "frozen"), r.text
        assert "frozen by alice: refund loop INC-1" in r.json()["error"]["message"]
        assert "ctrlrun unfreeze" in r.json()["error"]["message"]
        assert (
            httpx.get(f"{sc.stripe_base}/v1/refunds", headers=AUTH, timeout=10).status_code == 200
        )
        assert httpx.get(f"{sc.admin_url}/readyz", timeout=10).status_code == 200
    with context("sdk-agent"), pytest.raises(ActionFrozen, match="frozen by alice"):
        send("w1")
    assert len(stripe.refunds) == before and sent == ["w0"]
    assert "frozen by alice: refund loop INC-1" in cli(pair[1], "freezes")

    said = cli(pair[1], "unfreeze", "--as", "bob")
    assert said.startswith("unfrozen: every action by bob")
    time.sleep(SPREAD)
    for i, sc in enumerate(pair):
        assert refund(sc, f"pi_after_{i}", stripe).status_code == 200
    with context("sdk-agent"):
        send("w2")
    assert sent == ["w0", "w2"]
    receipts = cli(pair[0], "receipts", "--json")
    assert '"action": "ctrlrun.freeze"' in receipts and '"approver": "alice"' in receipts
    assert '"action": "ctrlrun.unfreeze"' in receipts and '"approver": "bob"' in receipts
    store.close()


def test_a_freeze_of_one_action_leaves_the_others(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ctrlrun.cli import main as cli_main

    policy = SDK_POLICY + '  wire.cancel:\n    effect: "cancel:{wire_id}"\n    decision: allow\n'
    url = f"sqlite:///{tmp_path / 'state.db'}"
    store = open_store(url)
    control = Control(Policy.from_yaml(policy), store)

    @protect("wire.send", control=control)
    def send(wire_id: str) -> str:
        return wire_id

    @protect("wire.cancel", control=control)
    def cancel(wire_id: str) -> str:
        return wire_id

    ran = CliRunner().invoke(
        cli_main,
        [
            "freeze",
            "--action",
            "wire.send",
            "--reason",
            "audit",
            "--as",
            "alice",
            "--store-url",
            url,
        ],
        env=env(),
    )
    assert ran.exit_code == 0, ran.output
    store.freezes.forget()  # this process reads the switch now, not within its half second
    with context("bot"):
        with pytest.raises(ActionFrozen) as info:
            send("w1")
        assert cancel("w1") == "w1"
    assert info.value.reason == "frozen" and info.value.receipt_id
    ran = CliRunner().invoke(cli_main, ["unfreeze", "--action", "wire.send", "--store-url", url])
    assert "unfrozen: wire.send by" in ran.output
    again = CliRunner().invoke(cli_main, ["unfreeze", "--store-url", url])
    assert again.output == "every action was not frozen; nothing changed\n"
    bad = CliRunner().invoke(cli_main, ["freeze", "--reason", " ", "--store-url", url])
    assert bad.exit_code == 2 and "a freeze needs a reason" in bad.output
    store.freezes.forget()
    with context("bot"):
        assert send("w2") == "w2"
    store.close()


UNMAPPED = """\
schema: ctrlrun.policy/v2
actions: {{}}
upstreams:
  site:
    profile: http
    url: {stripe}
    listen: 127.0.0.1:{stripe_port}
    unmapped_writes: allow
"""


def test_a_freeze_stops_writes_no_route_maps_too(
    fakes: tuple[FakeStripe, FakeKubernetes], sidecars: Callable[..., Sidecar]
) -> None:
    """``unmapped_writes: allow`` forwards a write no admission decides: the switch holds."""
    stripe, kube = fakes
    sc = sidecars(stripe, kube, policy_text=UNMAPPED)

    def post() -> httpx.Response:
        url = f"{sc.stripe_base}/v1/customers"
        return httpx.post(url, data={"email": "a@b.test"}, headers=AUTH, timeout=10)

    assert post().headers.get("X-Ctrlrun-Outcome") is None  # forwarded, the remote answered
    before = stripe.count("POST", "/v1/customers")
    cli(sc, "freeze", "--reason", "incident", "--as", "alice")
    time.sleep(SPREAD)
    r = post()
    assert (r.status_code, r.headers["X-Ctrlrun-Outcome"]) == (403, "frozen"), r.text
    assert stripe.count("POST", "/v1/customers") == before
    assert '"decision_reason": "frozen"' in cli(sc, "receipts", "--json")
