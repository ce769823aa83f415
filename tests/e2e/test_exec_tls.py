"""Over TLS through the explicit proxy, as an agent in a cluster talks to its apiserver: the
interception relays an allowed ``kubectl exec`` (a WebSocket inside the intercepted TLS) and
streams a watch, and a denied exec reaches nothing."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest
from harness import KUBE_TOKEN, KUBECONFIG_TLS, POLICY, Sidecar, proxy_url_line, running_sidecar
from test_exec import ALLOW, receipts
from test_kubectl import kubectl
from test_streaming import first_added_after

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(120)
KUBECTL = shutil.which("kubectl")


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sidecar, FakeKubernetes]]:
    with FakeStripe() as stripe, FakeKubernetes(tls=True) as kube:
        kube.add_pod("default", "web-0")
        kube.add_pod("default", "db-0")
        ca = str(kube.ca_file).replace("{", "{{").replace("}", "}}")
        anchor = "    cluster: prod-eu\n"
        text = POLICY.replace(anchor, f"{anchor}    ca_file: {ca}\n")
        text = text.replace(
            "upstreams:\n",
            ALLOW.replace(
                "k8s.exec:\n    decision: allow",
                ("k8s.exec:\n    rules:\n      - when: {{pod_eq: web-0}}\n        decision: allow"),
            ),
            1,
        )
        with running_sidecar(
            tmp_path_factory.mktemp("tls"), stripe, kube, policy_text=text, in_process=True
        ) as sc:
            yield sc, kube


def home_for(tmp_path: Path, sc: Sidecar, kube: FakeKubernetes) -> Path:
    ca = sc.workdir / "mitm" / "mitmproxy-ca-cert.pem"
    config = KUBECONFIG_TLS.format(
        server=kube.url, ca=ca, proxy=proxy_url_line(sc), token=KUBE_TOKEN
    )
    (tmp_path / "kubeconfig").write_text(config)
    return tmp_path


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_kubectl_exec_over_intercepted_tls(
    tls: tuple[Sidecar, FakeKubernetes], tmp_path: Path
) -> None:
    sc, kube = tls
    before = len(receipts(sc))
    home = home_for(tmp_path, sc, kube)

    done, _ = kubectl(home, "exec", "web-0", "--", "uptime")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ran uptime")

    denied, _ = kubectl(home, "exec", "db-0", "--", "psql")
    assert denied.returncode != 0 and "ctrlrun:" in denied.stderr
    assert [(s.pod, s.command[0]) for s in kube.sessions] == [("web-0", "uptime")]
    got = [(r["arguments"]["pod"], r["decision"]) for r in receipts(sc)[before:]]
    assert got[0] == ("web-0", "allow") and set(got[1:]) == {("db-0", "deny")}


def test_a_watch_over_intercepted_tls_is_streamed(tls: tuple[Sidecar, FakeKubernetes]) -> None:
    sc, kube = tls
    cfg = kubernetes.client.Configuration(
        host=kube.url,
        api_key={"authorization": KUBE_TOKEN},
        api_key_prefix={"authorization": "Bearer"},
    )
    cfg.proxy = sc.proxy_url
    cfg.ssl_ca_cert = str(sc.workdir / "mitm" / "mitmproxy-ca-cert.pem")
    api = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(cfg))
    assert first_added_after(api, kube, "watched-tls") < 0.5
