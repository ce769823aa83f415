"""TLS through the explicit proxy: the official stripe client, pointed at an HTTPS Stripe
through ``proxy=`` or ``HTTPS_PROXY``, is intercepted only for the configured upstream;
every other TLS host is tunnelled untouched (the client's own CA trust decides)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import stripe
from harness import POLICY, Sidecar, running_sidecar
from stripe_support import effect, outcome, receipts_for, refund, refused, stripe_client

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(120)
ANCHOR = "    api_key_env: STRIPE_E2E_KEY\n"


@pytest.fixture(scope="module")
def remotes() -> Iterator[tuple[FakeStripe, FakeStripe, FakeKubernetes]]:
    """The guarded Stripe, a second TLS Stripe that no upstream names, and a cluster."""
    with FakeStripe(tls=True) as guarded, FakeStripe(tls=True) as other, FakeKubernetes() as kube:
        yield guarded, other, kube


@pytest.fixture(scope="module")
def sc(
    tmp_path_factory: pytest.TempPathFactory,
    remotes: tuple[FakeStripe, FakeStripe, FakeKubernetes],
) -> Iterator[Sidecar]:
    guarded, _, kube = remotes
    assert guarded.url.startswith("https://") and guarded.ca_file is not None
    ca = str(guarded.ca_file).replace("{", "{{").replace("}", "}}")
    text = POLICY.replace(ANCHOR, f"{ANCHOR}    ca_file: {ca}\n")
    assert text != POLICY
    with running_sidecar(
        tmp_path_factory.mktemp("tls"), guarded, kube, policy_text=text, reconcile="off"
    ) as sidecar:
        yield sidecar


@pytest.fixture
def fakes(
    remotes: tuple[FakeStripe, FakeStripe, FakeKubernetes],
) -> tuple[FakeStripe, FakeStripe]:
    for fake in remotes[:2]:
        fake.fail_next(None)
        fake.reset_counts()
    return remotes[0], remotes[1]


@pytest.fixture
def trust(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No proxy settings from the environment; tests set ``stripe.ca_bundle_path`` freely."""
    for name in (
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(stripe, "ca_bundle_path", stripe.ca_bundle_path)
    yield


def proxy_ca(sc: Sidecar) -> Path:
    ca = sc.workdir / "mitm" / "mitmproxy-ca-cert.pem"
    assert str(ca) in sc.start_line  # the start-up line names the CA clients must trust
    return ca


@pytest.mark.parametrize("via", ["argument", "environment"])
def test_refund_over_tls_is_intercepted_and_recorded(
    sc: Sidecar,
    fakes: tuple[FakeStripe, FakeStripe],
    trust: None,
    via: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    guarded, _ = fakes
    # Trust the proxy's CA only: success proves the answer came through the interception.
    bundle = tmp_path / "bundle.pem"
    bundle.write_text(proxy_ca(sc).read_text())
    stripe.ca_bundle_path = str(bundle)
    if via == "environment":
        monkeypatch.setenv("HTTPS_PROXY", sc.proxy_url)
    client = stripe_client(guarded.url, proxy=sc.proxy_url if via == "argument" else None)
    pi = guarded.add_payment_intent(amount=5000)["id"]

    done = refund(client, pi, 1000)

    assert done.status == "succeeded"
    record = effect(sc, f"refund:{pi}")
    assert record is not None and record.state.value == "committed"
    assert record.idempotency_key  # the client's own key, kept with the attempt

    err = refused(lambda: refund(client, pi, 1000))

    assert err.http_status == 409 and outcome(err) == "duplicate"
    assert guarded.count("POST", "/v1/refunds") == 1
    assert [r["payment_intent"] for r in guarded.refunds].count(pi) == 1


def test_a_client_trusting_only_the_remote_ca_cannot_reach_an_intercepted_host(
    sc: Sidecar, fakes: tuple[FakeStripe, FakeStripe], trust: None
) -> None:
    guarded, _ = fakes
    assert guarded.ca_file is not None
    stripe.ca_bundle_path = str(guarded.ca_file)
    client = stripe_client(guarded.url, proxy=sc.proxy_url, retries=0)
    pi = guarded.add_payment_intent(amount=5000)["id"]

    err = refused(lambda: refund(client, pi, 1000))

    assert isinstance(err, stripe.APIConnectionError)
    assert guarded.requests == [] and effect(sc, f"refund:{pi}") is None


def test_a_host_that_is_no_upstream_is_tunnelled_untouched(
    sc: Sidecar, fakes: tuple[FakeStripe, FakeStripe], trust: None
) -> None:
    _, other = fakes
    assert other.ca_file is not None
    # Trust the remote's own CA only: a certificate minted by the proxy would fail.
    stripe.ca_bundle_path = str(other.ca_file)
    client = stripe_client(other.url, proxy=sc.proxy_url, retries=0)
    pi = other.add_payment_intent(amount=5000)["id"]

    first = refund(client, pi, 1000)
    second = refund(client, pi, 1000)  # not guarded: nothing refuses the duplicate

    assert first.status == second.status == "succeeded" and first.id != second.id
    assert other.count("POST", "/v1/refunds") == 2
    assert effect(sc, f"refund:{pi}") is None and receipts_for(sc, f"refund:{pi}") == []
