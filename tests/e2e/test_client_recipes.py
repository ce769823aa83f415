"""The README's recipes for pointing common clients at the sidecar, each run as written.

The remotes speak TLS and every client trusts the proxy's CA only: a request that succeeds went
through the interception, and one that went around the proxy fails its handshake. Each recipe
is shown guarded by a refund (or scale) that commits and leaves a record.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import stripe
from harness import (
    KUBE_TOKEN,
    KUBECONFIG_TLS,
    POLICY,
    STRIPE_KEY,
    Sidecar,
    clean_env,
    proxy_url_line,
    running_sidecar,
)
from kubernetes.client.rest import ApiException

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(120)
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")
PROXY_VARIABLES += ("all_proxy", "NO_PROXY", "no_proxy")


@pytest.fixture(scope="module")
def remotes() -> Iterator[tuple[FakeStripe, FakeKubernetes]]:
    with FakeStripe(tls=True) as stripe_fake, FakeKubernetes(tls=True) as kube:
        kube.add_deployment(namespace="default", name="checkout", replicas=3)
        yield stripe_fake, kube


@pytest.fixture(scope="module")
def sc(
    tmp_path_factory: pytest.TempPathFactory, remotes: tuple[FakeStripe, FakeKubernetes]
) -> Iterator[Sidecar]:
    stripe_fake, kube = remotes
    ca = str(stripe_fake.ca_file).replace("{", "{{").replace("}", "}}")
    text = POLICY
    for anchor in ("    api_key_env: STRIPE_E2E_KEY\n", "    cluster: prod-eu\n"):
        text = text.replace(anchor, f"{anchor}    ca_file: {ca}\n")
    with running_sidecar(
        tmp_path_factory.mktemp("recipes"), stripe_fake, kube, policy_text=text, reconcile="off"
    ) as sidecar:
        yield sidecar


@pytest.fixture
def ca(sc: Sidecar, monkeypatch: pytest.MonkeyPatch) -> str:
    """The proxy's CA file; no proxy variable is left over from the environment."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(stripe, "ca_bundle_path", stripe.ca_bundle_path)
    path = sc.workdir / "mitm" / "mitmproxy-ca-cert.pem"
    assert str(path) in sc.start_line
    return str(path)


def committed(sc: Sidecar, key: str) -> bool:
    return sc.effect_state(key) == "committed"


def new_payment(remotes: tuple[FakeStripe, FakeKubernetes]) -> str:
    return str(remotes[0].add_payment_intent(amount=5000)["id"])


def refund_params(pi: str) -> Any:
    return {"payment_intent": pi, "amount": 1000}


def test_stripe_python_sync_reads_https_proxy(
    sc: Sidecar, remotes: tuple[FakeStripe, FakeKubernetes], ca: str, monkeypatch: Any
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", sc.proxy_url)
    stripe.ca_bundle_path = ca  # stripe-python trusts its own bundle, not SSL_CERT_FILE
    client = stripe.StripeClient(STRIPE_KEY, base_addresses={"api": remotes[0].url})
    pi = new_payment(remotes)

    assert client.v1.refunds.create(params=refund_params(pi)).status == "succeeded"
    assert committed(sc, f"refund:{pi}")


def test_stripe_python_async_httpx_reads_https_proxy(
    sc: Sidecar, remotes: tuple[FakeStripe, FakeKubernetes], ca: str, monkeypatch: Any
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", sc.proxy_url)
    stripe.ca_bundle_path = ca
    pi = new_payment(remotes)

    async def agent() -> str:
        # The client reads HTTPS_PROXY when it is built: set it first. (Its proxy= argument
        # is passed per request, which httpx 0.28 no longer accepts.)
        http = stripe.HTTPXClient()
        client = stripe.StripeClient(
            STRIPE_KEY, base_addresses={"api": remotes[0].url}, http_client=http
        )
        try:
            return str((await client.v1.refunds.create_async(params=refund_params(pi))).status)
        finally:
            await http.close_async()

    assert asyncio.run(agent()) == "succeeded"
    assert committed(sc, f"refund:{pi}")


def test_stripe_python_async_aiohttp_needs_the_proxy_argument(
    sc: Sidecar, remotes: tuple[FakeStripe, FakeKubernetes], ca: str, monkeypatch: Any
) -> None:
    pytest.importorskip("aiohttp")
    monkeypatch.setenv("HTTPS_PROXY", sc.proxy_url)
    stripe.ca_bundle_path = ca
    pi = new_payment(remotes)

    async def agent(proxy: str | None) -> str:
        http = stripe.AIOHTTPClient(proxy=proxy)
        client = stripe.StripeClient(
            STRIPE_KEY,
            base_addresses={"api": remotes[0].url},
            http_client=http,
            max_network_retries=0,
        )
        try:
            return str((await client.v1.refunds.create_async(params=refund_params(pi))).status)
        finally:
            await http.close_async()

    # HTTPS_PROXY alone: aiohttp goes straight to the remote (and fails on the proxy's CA).
    with pytest.raises(stripe.APIConnectionError):
        asyncio.run(agent(None))
    assert sc.effect_state(f"refund:{pi}") is None
    assert asyncio.run(agent(sc.proxy_url)) == "succeeded"
    assert committed(sc, f"refund:{pi}")


def kube_configuration(sc: Sidecar, kube: FakeKubernetes, ca: str) -> Any:
    cfg = kubernetes.client.Configuration(
        host=kube.url,
        api_key={"authorization": KUBE_TOKEN},
        api_key_prefix={"authorization": "Bearer"},
    )
    cfg.proxy = sc.proxy_url  # older clients never read HTTPS_PROXY: name it
    cfg.ssl_ca_cert = ca
    return cfg


def test_kubernetes_python_client_with_proxy_and_ca(
    sc: Sidecar, remotes: tuple[FakeStripe, FakeKubernetes], ca: str
) -> None:
    kube = remotes[1]
    api = kubernetes.client.AppsV1Api(kubernetes.client.ApiClient(kube_configuration(sc, kube, ca)))
    body = {"spec": {"replicas": 7}}

    scaled = api.patch_namespaced_deployment_scale("checkout", "default", body, _request_timeout=30)

    assert scaled.spec.replicas == 7 and committed(sc, "scale:prod-eu:checkout:7")
    core = kubernetes.client.CoreV1Api(
        kubernetes.client.ApiClient(kube_configuration(sc, kube, ca))
    )
    with pytest.raises(ApiException) as denied:
        core.delete_namespace("default", _request_timeout=30)
    assert denied.value.status == 403 and denied.value.headers["X-Ctrlrun-Outcome"] == "denied"


def kubectl(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None
    return subprocess.run(
        [kubectl, *args, "--request-timeout=20s"],
        capture_output=True,
        text=True,
        env=clean_env(HOME=str(home), KUBECONFIG=str(home / "kubeconfig"), **env),
        timeout=90,
    )


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_needs_proxy_url_for_a_loopback_server(
    sc: Sidecar, remotes: tuple[FakeStripe, FakeKubernetes], ca: str, tmp_path: Path
) -> None:
    kube = remotes[1]
    config = tmp_path / "kubeconfig"
    plain = {"server": kube.url, "ca": ca, "token": KUBE_TOKEN}
    # Go never proxies a loopback address from HTTPS_PROXY: kubectl goes straight to the
    # remote, which does not present the proxy's CA.
    config.write_text(KUBECONFIG_TLS.format(proxy="", **plain))
    direct = kubectl(
        tmp_path, "scale", "deployment", "checkout", "--replicas=8", HTTPS_PROXY=sc.proxy_url
    )
    assert direct.returncode != 0 and "certificate" in direct.stderr, direct.stderr
    assert sc.effect_state("scale:prod-eu:checkout:8") is None
    # proxy-url in the kubeconfig applies to every server, loopback included.
    config.write_text(KUBECONFIG_TLS.format(proxy=proxy_url_line(sc), **plain))
    done = kubectl(tmp_path, "scale", "deployment", "checkout", "--replicas=8")
    assert done.returncode == 0, done.stderr
    assert committed(sc, "scale:prod-eu:checkout:8")


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize("via", ["--proxy", "HTTPS_PROXY"])
def test_curl_through_the_sidecar(
    sc: Sidecar, remotes: tuple[FakeStripe, FakeKubernetes], ca: str, via: str
) -> None:
    pi = new_payment(remotes)
    args = ["--proxy", sc.proxy_url] if via == "--proxy" else []
    env = clean_env(HTTPS_PROXY=sc.proxy_url) if via == "HTTPS_PROXY" else clean_env()
    done = subprocess.run(
        [
            "curl",
            "-sS",
            "--max-time",
            "20",
            "--cacert",
            ca,
            *args,
            "-u",
            f"{STRIPE_KEY}:",
            "-d",
            f"payment_intent={pi}",
            "-d",
            "amount=1000",
            f"{remotes[0].url}/v1/refunds",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "succeeded", done.stdout
    assert committed(sc, f"refund:{pi}")


NODE_MODULES = Path(__file__).resolve().parents[2] / ".venv" / "node" / "node_modules"
NODE_SCRIPTS = Path(__file__).resolve().parent / "node"
needs_node = pytest.mark.skipif(
    shutil.which("node") is None or not (NODE_MODULES / "stripe").is_dir(),
    reason="node or its packages are not installed (.ci/run: npm install --prefix .venv/node)",
)


def node(tmp_path: Path, script: str, *args: str, **env: str) -> dict[str, Any]:
    """Run one of tests/e2e/node/ with the packages .ci/run installed beside it."""
    (tmp_path / "node_modules").symlink_to(NODE_MODULES)
    shutil.copy(NODE_SCRIPTS / script, tmp_path / script)
    done = subprocess.run(
        ["node", str(tmp_path / script), *args],
        capture_output=True,
        text=True,
        env=clean_env(**env),
        timeout=90,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@needs_node
@pytest.mark.parametrize("agent", [False, True])
def test_stripe_node_needs_an_http_agent_and_node_extra_ca_certs(
    sc: Sidecar,
    remotes: tuple[FakeStripe, FakeKubernetes],
    ca: str,
    tmp_path: Path,
    agent: bool,
) -> None:
    pi = new_payment(remotes)
    proxy = (sc.proxy_url,) if agent else ()
    env = {"STRIPE_KEY": STRIPE_KEY, "NODE_EXTRA_CA_CERTS": ca, "HTTPS_PROXY": sc.proxy_url}
    answer = node(tmp_path, "stripe_refund.cjs", remotes[0].url, pi, *proxy, **env)
    if agent:
        assert answer == {"status": "succeeded"} and committed(sc, f"refund:{pi}")
    else:  # HTTPS_PROXY alone: straight to the remote, whose certificate Node refuses
        assert answer["error"] == "StripeConnectionError", answer
        assert sc.effect_state(f"refund:{pi}") is None


@needs_node
@pytest.mark.parametrize("proxy_url", [False, True])
def test_kubernetes_client_node_needs_proxy_url(
    sc: Sidecar,
    remotes: tuple[FakeStripe, FakeKubernetes],
    ca: str,
    tmp_path: Path,
    proxy_url: bool,
) -> None:
    kube = remotes[1]
    proxy = proxy_url_line(sc) if proxy_url else ""
    config = tmp_path / "kubeconfig"
    config.write_text(KUBECONFIG_TLS.format(server=kube.url, ca=ca, token=KUBE_TOKEN, proxy=proxy))
    replicas = "11" if proxy_url else "12"
    env = {"KUBECONFIG": str(config), "HTTPS_PROXY": sc.proxy_url, "HOME": str(tmp_path)}
    answer = node(tmp_path, "kube_scale.mjs", replicas, **env)
    if proxy_url:
        assert answer == {"replicas": 11} and committed(sc, "scale:prod-eu:checkout:11")
    else:  # HTTPS_PROXY alone: straight to the remote, whose certificate does not verify
        assert "error" in answer, answer
        assert sc.effect_state("scale:prod-eu:checkout:12") is None
