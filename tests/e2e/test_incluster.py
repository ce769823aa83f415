"""The official Kubernetes client with in-cluster configuration, through the sidecar.

In a pod the client dials ``$KUBERNETES_SERVICE_HOST`` (an IP) while the policy names the API
server (``kubernetes.default.svc``; here ``localhost``, the name a test can resolve): the
request is that upstream's and the policy decides it, over the CONNECT tunnel the client opens
through ``HTTPS_PROXY`` and the certificate it checks against the IP.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest
from harness import KUBE_TOKEN, Sidecar, running_sidecar
from kubernetes.client.rest import ApiException
from kubernetes.config.incluster_config import InClusterConfigLoader

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(120)

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  k8s.scale:
    effect: "scale:{{cluster}}:{{deployment}}:{{replicas}}"
    rules:
      - when: {{replicas_lte: 10}}
        decision: allow
      - decision: deny
upstreams:
  cluster:
    profile: kubernetes
    url: https://localhost:PORT
    cluster: prod-eu
    ca_file: CA
    reconcile: "off"
"""


@pytest.fixture
def incluster(tmp_path: Path) -> Iterator[tuple[Sidecar, FakeKubernetes]]:
    with FakeStripe() as stripe, FakeKubernetes(tls=True) as kube:
        kube.add_deployment(namespace="default", name="checkout", replicas=3)
        text = POLICY.replace("PORT", str(kube.port)).replace("CA", str(kube.ca_file))
        with running_sidecar(tmp_path, stripe, kube, policy_text=text, in_process=True) as sc:
            yield sc, kube


def in_cluster_api(sc: Sidecar, kube: FakeKubernetes, secrets: Path) -> kubernetes.client.AppsV1Api:
    """``load_incluster_config`` as in a pod whose service is 127.0.0.1, trusting the proxy's CA."""
    secrets.mkdir()
    (secrets / "token").write_text(KUBE_TOKEN)
    ca = sc.workdir / "mitm" / "mitmproxy-ca-cert.pem"
    cfg = kubernetes.client.Configuration()
    InClusterConfigLoader(
        token_filename=str(secrets / "token"),
        cert_filename=str(ca),
        environ={"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(kube.port)},
    ).load_and_set(cfg)
    assert cfg.host == f"https://127.0.0.1:{kube.port}"
    cfg.proxy = sc.proxy_url  # what HTTPS_PROXY says in the pod
    return kubernetes.client.AppsV1Api(kubernetes.client.ApiClient(cfg))


def test_the_in_cluster_client_dialling_the_ip_is_decided_by_policy(
    incluster: tuple[Sidecar, FakeKubernetes], tmp_path: Path
) -> None:
    sc, kube = incluster
    api = in_cluster_api(sc, kube, tmp_path / "serviceaccount")
    body = {"spec": {"replicas": 5}}

    assert api.patch_namespaced_deployment_scale("checkout", "default", body).spec.replicas == 5
    with pytest.raises(ApiException) as err:
        api.patch_namespaced_deployment_scale("checkout", "default", {"spec": {"replicas": 50}})
    assert err.value.status == 403 and "ctrlrun" in str(err.value.body)
    # A read through the same tunnel passes, and sees only the allowed scale.
    assert api.read_namespaced_deployment_scale("checkout", "default").spec.replicas == 5

    assert kube.count("PATCH") == 1 and kube.replicas("default", "checkout") == 5
    got = [(r.action, r.result) for r in sc.receipts()]
    assert got == [("k8s.scale", "committed"), ("k8s.scale", "denied")]
