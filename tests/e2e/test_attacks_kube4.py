"""Kubernetes writes that reach what ctrlrun decides by another road, through a real sidecar
to the fake apiserver: the garbage collector (an owner that is not there), a controller (an
autoscaler's minimum), the kubelet (a pod's image), an API group older than apps/v1."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import KUBE_TOKEN, POLICY, Sidecar, running_sidecar
from test_attacks_kube import send
from test_attacks_kube2 import ALLOW_UNMAPPED, DENY_SCALE
from test_exec import read_head
from test_kubectl import KUBECONFIG, kubectl
from test_kubectl_writes import STARTER_WITH_FAKES

from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(180)
GHOST = {"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "0" * 8 + "-dead"}


def kubectl_home(sidecar: Sidecar, tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    config = KUBECONFIG.format(server=sidecar.kube_base, token=KUBE_TOKEN)
    (home / "kubeconfig").write_text(config)
    return home


def test_an_owner_that_is_not_there_is_refused_as_the_delete_it_is(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    # The garbage collector deletes an object whose every owner is gone (absent, or another
    # uid): an update adding such an owner is a delete of the deployment, which the starter
    # policy denies, by way of k8s.update_deployment, which it allows.
    kube = fakes[1]
    with running_sidecar(
        tmp_path / "sc", *fakes, policy_text=STARTER_WITH_FAKES, in_process=True
    ) as sidecar:
        home = kubectl_home(sidecar, tmp_path)
        patch = json.dumps({"metadata": {"ownerReferences": [GHOST]}})
        done, _ = kubectl(home, "patch", "deployment/checkout", "--type=merge", "-p", patch)
        assert done.returncode != 0, done.stdout
        assert "ownerReferences" in done.stderr, done.stderr
        assert "ownerReferences" not in kube.deployment("default", "checkout")["metadata"]
        # A label is still an update, decided and applied.
        done, _ = kubectl(home, "label", "deployment/checkout", "team=pay")
        assert done.returncode == 0, done.stderr
        assert kube.deployment("default", "checkout")["metadata"]["labels"]["team"] == "pay"


HPA = {
    "apiVersion": "autoscaling/v2",
    "kind": "HorizontalPodAutoscaler",
    "metadata": {"name": "checkout", "namespace": "default"},
    "spec": {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "checkout"},
        "minReplicas": 50,
        "maxReplicas": 60,
    },
}
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "web-0", "namespace": "default"},
    "spec": {"containers": [{"name": "app", "image": "evil.example/miner:1"}]},
}
MERGE, SMP, JSONP = (
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/json-patch+json",
)
APPLY = "application/apply-patch+yaml"
HPAS = "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers"
WEB = "/api/v1/namespaces/default/pods/web-0"
SCALE_TO_50 = {"spec": {"replicas": 50}}
ROADS: list[tuple[str, str, str, object]] = [
    # An autoscaler's controller sets the deployment's replicas to at least minReplicas.
    ("POST", HPAS, "application/json", HPA),
    ("POST", HPAS.replace("/v2/", "/v1/"), "application/json", HPA),
    ("PATCH", f"{HPAS}/checkout", MERGE, {"spec": {"minReplicas": 50}}),
    (
        "PATCH",
        f"{HPAS}/checkout",
        JSONP,
        [{"op": "replace", "path": "/spec/minReplicas", "value": 50}],
    ),
    ("PATCH", f"{HPAS}/checkout?fieldManager=agent", APPLY, HPA),
    ("PUT", f"{HPAS}/checkout", "application/json", HPA),
    # Apply drops the fields its manager applied before and leaves out: minReplicas included.
    (
        "PATCH",
        f"{HPAS}/checkout?fieldManager=agent",
        APPLY,
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "checkout"},
        },
    ),
    # A running pod's new image: the kubelet restarts the container on it (kubectl set image).
    ("PATCH", WEB, SMP, {"spec": {"containers": [{"name": "app", "image": "evil:1"}]}}),
    ("PATCH", WEB, MERGE, {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": []}}),
    ("PATCH", WEB, JSONP, [{"op": "replace", "path": "/spec/containers/0/image", "value": "e"}]),
    ("PATCH", WEB, JSONP, [{"op": "move", "from": "/metadata/x", "path": "/spec/x"}]),
    ("PATCH", WEB, JSONP, [{"op": "copy", "from": "/metadata/name", "path": "/Spec"}]),
    ("PATCH", WEB, JSONP, [{"op": "replace", "path": "", "value": POD}]),
    ("PATCH", WEB, SMP, {"$patch": "replace", **POD}),
    ("PATCH", WEB, MERGE, {"Spec": POD["spec"]}),  # an apiserver reading keys without case
    ("PATCH", f"{WEB}?fieldManager=agent", APPLY, POD),
    ("PUT", WEB, "application/json", POD),
    # Workloads under the names of clusters before 1.16.
    (
        "PATCH",
        "/apis/extensions/v1beta1/namespaces/default/deployments/checkout/scale",
        MERGE,
        SCALE_TO_50,
    ),
    ("PATCH", "/apis/apps/v1beta2/namespaces/default/deployments/checkout", MERGE, SCALE_TO_50),
    ("PUT", "/apis/apps/v1beta1/namespaces/default/statefulsets/db/scale", "application/json", {}),
    ("DELETE", "/apis/apps/v1beta1/namespaces/default/deployments/checkout", "", None),
    ("DELETE", "/apis/extensions/v1beta1/namespaces/default/replicasets?labelSelector=a", "", None),
    (
        "POST",
        "/apis/extensions/v1beta1/namespaces/default/deployments/checkout/rollback",
        "application/json",
        {"name": "checkout", "rollbackTo": {"revision": 1}},
    ),
    # Namespaces: many deleted at once (served before 1.11), or one by its garbage collector.
    ("DELETE", "/api/v1/namespaces?labelSelector=env%3Dprod", "", None),
    ("PATCH", "/api/v1/namespaces/prod", MERGE, {"metadata": {"ownerReferences": [GHOST]}}),
    ("PATCH", "/api/v1/namespaces/prod", SMP, {"metadata": {"OwnerReferences": [GHOST]}}),
    ("PATCH", "/api/v1/namespaces/prod", JSONP, [{"op": "add", "path": "/metadata", "value": {}}]),
    (
        "PATCH",
        "/api/v1/namespaces/prod/status",
        JSONP,
        [{"op": "add", "path": "/metadata/ownerReferences", "value": [GHOST]}],
    ),
    # A workload's /status resets its spec and labels, not its owners (deploymentStatusStrategy).
    (
        "PATCH",
        "/apis/apps/v1/namespaces/default/deployments/checkout/status",
        MERGE,
        {"metadata": {"ownerReferences": [GHOST]}},
    ),
    (
        "PUT",
        "/apis/apps/v1/namespaces/default/statefulsets/db/status",
        "application/json",
        {"metadata": {"name": "db", "ownerReferences": [GHOST]}},
    ),
]


@pytest.fixture
def allowing(tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[Sidecar]:
    """A sidecar whose cluster upstream forwards unmapped writes (recorded, undecided)."""
    fakes[1].add_namespace("prod")
    fakes[1].add_pod("default", "web-0")
    with running_sidecar(tmp_path, *fakes, policy_text=ALLOW_UNMAPPED, in_process=True) as sidecar:
        yield sidecar


@pytest.mark.parametrize(("method", "path", "content_type", "body"), ROADS)
def test_a_scale_a_delete_or_new_code_by_another_road_is_refused_under_unmapped_writes_allow(
    allowing: Sidecar,
    fakes: tuple[FakeStripe, FakeKubernetes],
    method: str,
    path: str,
    content_type: str,
    body: object,
) -> None:
    kube = fakes[1]
    headers = [("Content-Type", content_type)] if content_type else []
    data = b"" if body is None else json.dumps(body).encode()
    status, got, text = send(allowing.kube_base, method, path, headers, data)
    assert got.get("x-ctrlrun-outcome") == "invalid_request", (status, text)
    assert status == 422 and json.loads(text)["kind"] == "Status", text
    assert kube.count(method) == 0
    assert kube.replicas("default", "checkout") == 3 and "prod" in kube.namespaces


@pytest.mark.parametrize(
    ("method", "path", "content_type", "body"),
    [
        # What kubectl label and annotate send: metadata only, an unmapped write as before.
        ("PATCH", WEB, MERGE, {"metadata": {"labels": {"team": "pay"}}}),
        ("PATCH", WEB, JSONP, [{"op": "add", "path": "/metadata/annotations/a", "value": "b"}]),
        ("PATCH", f"{HPAS}/checkout", MERGE, {"metadata": {"labels": {"team": "pay"}}}),
        ("DELETE", f"{HPAS}/checkout", "", None),  # the replicas stay where they are
        ("PATCH", f"{HPAS}/checkout/status", MERGE, {"status": {"desiredReplicas": 50}}),
        ("PATCH", "/api/v1/namespaces/prod", MERGE, {"metadata": {"labels": {"env": "prod"}}}),
        (
            "PATCH",
            "/api/v1/namespaces/prod/status",
            JSONP,
            [{"op": "replace", "path": "/status/phase", "value": "Active"}],
        ),
        (
            "PATCH",
            "/apis/apps/v1/namespaces/default/deployments/checkout/status",
            MERGE,
            {"status": {"readyReplicas": 3}},
        ),
        # A create through an old group names no object ctrlrun decides (nor does apps/v1's).
        ("POST", "/apis/apps/v1beta2/namespaces/default/deployments", "application/json", {}),
    ],
)
def test_other_unmapped_writes_still_go_recorded(
    allowing: Sidecar,
    fakes: tuple[FakeStripe, FakeKubernetes],
    method: str,
    path: str,
    content_type: str,
    body: object,
) -> None:
    kube = fakes[1]
    headers = [("Content-Type", content_type)] if content_type else []
    data = b"" if body is None else json.dumps(body).encode()
    status, got, text = send(allowing.kube_base, method, path, headers, data)
    assert "x-ctrlrun-outcome" not in got, (status, text)
    assert kube.count(method) == 1


def test_kubectl_set_image_on_a_pod_is_refused_and_kubectl_label_goes(
    allowing: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], tmp_path: Path
) -> None:
    kube = fakes[1]
    home = kubectl_home(allowing, tmp_path)
    done, _ = kubectl(home, "set", "image", "pod/web-0", "app=evil.example/miner:1")
    assert done.returncode != 0 and "ctrlrun" in done.stderr, done.stderr
    assert "image" in done.stderr and kube.count("PATCH") == 0
    done, _ = kubectl(home, "label", "pod/web-0", "team=pay")
    assert "ctrlrun" not in done.stderr, done.stderr  # forwarded: the fake serves no pod PATCH
    assert kube.count("PATCH") == 1


def test_the_python_client_creating_an_autoscaler_is_refused(
    allowing: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    from kubernetes import client

    config = client.Configuration(host=allowing.kube_base)
    config.api_key = {"authorization": f"Bearer {KUBE_TOKEN}"}
    with client.ApiClient(config) as api, pytest.raises(client.ApiException) as raised:
        client.AutoscalingV2Api(api).create_namespaced_horizontal_pod_autoscaler("default", HPA)
    assert raised.value.status == 422 and "k8s.scale" in str(raised.value.body)
    assert fakes[1].count("POST") == 0


DEPLOY = "/apis/apps/v1/namespaces/default/deployments/checkout"


@pytest.mark.parametrize(
    "query",
    [
        # ctrlrun asks with "&dryRun=All" beside the agent's own: an apiserver taking "all"
        # or a blank for a write would apply it while ctrlrun asks. Refused before asking.
        "?dryRun=all",
        "?dryRun=All&dryRun=",
        "?dryRun=All&dryRun",
        "?dryRun=All+",
        "?dryRun=All;x",  # Go drops the pair: a real write
    ],
)
def test_a_dry_run_the_apiserver_does_not_accept_is_refused_before_asking(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes], query: str
) -> None:
    kube = fakes[1]
    with running_sidecar(tmp_path, *fakes, policy_text=DENY_SCALE, in_process=True) as sidecar:
        body = json.dumps(SCALE_TO_50).encode()
        status, got, text = send(
            sidecar.kube_base, "PATCH", f"{DEPLOY}/scale{query}", [("Content-Type", MERGE)], body
        )
        assert got.get("x-ctrlrun-outcome") == "invalid_request", (status, text)
        assert status == 422 and b"dryRun=All" in text
        assert kube.count("PATCH") == 0 and kube.replicas("default", "checkout") == 3


@pytest.mark.parametrize(
    ("target", "content_type", "body", "outcome"),
    [
        # Decided on what the apiserver stores, whatever op or directive carries the count.
        (
            DEPLOY,
            JSONP,
            [{"op": "copy", "from": "/spec/progressDeadlineSeconds", "path": "/spec/replicas"}],
            "denied",
        ),
        (
            DEPLOY,
            JSONP,
            [{"op": "move", "from": "/spec/progressDeadlineSeconds", "path": "/spec/replicas"}],
            "invalid_request",
        ),
        (f"{DEPLOY}/scale", SMP, {"spec": {"$patch": "delete"}}, "denied"),  # a scale to 0
        (f"{DEPLOY}/scale?watch=true", MERGE, SCALE_TO_50, "denied"),  # a write, not a watch
        (
            f"{DEPLOY}?fieldManager=kubectl&force=true",
            APPLY,
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "checkout"},
                "spec": {"replicas": 50},
            },
            "denied",
        ),
    ],
)
def test_a_denied_scale_spelt_as_another_patch_is_denied(
    tmp_path: Path,
    fakes: tuple[FakeStripe, FakeKubernetes],
    target: str,
    content_type: str,
    body: object,
    outcome: str,
) -> None:
    kube = fakes[1]
    with running_sidecar(tmp_path, *fakes, policy_text=DENY_SCALE, in_process=True) as sidecar:
        headers = [("Content-Type", content_type)]
        status, got, text = send(
            sidecar.kube_base, "PATCH", target, headers, json.dumps(body).encode()
        )
        assert got.get("x-ctrlrun-outcome") == outcome, (status, text)
        assert kube.replicas("default", "checkout") == 3
        assert kube.count("PATCH") == 0  # ctrlrun's own questions persist nothing


def test_kubectl_autoscale_is_refused(
    allowing: Sidecar, fakes: tuple[FakeStripe, FakeKubernetes], tmp_path: Path
) -> None:
    home = kubectl_home(allowing, tmp_path)
    done, _ = kubectl(home, "autoscale", "deployment/checkout", "--min=50", "--max=60")
    assert done.returncode != 0 and "k8s.scale" in done.stderr, done.stderr
    assert fakes[1].count("POST") == 0 and fakes[1].replicas("default", "checkout") == 3


ONLY_8080 = """\
  k8s.port_forward:
    rules:
      - when:
          ports_eq: [8080]
        decision: allow
upstreams:
"""


@pytest.mark.parametrize(
    ("upgrade", "protocol"),
    [
        ("SPDY/3.1", ""),
        # What kubectl 1.31+ sends: SPDY tunnelled in a WebSocket, the ports in its streams.
        ("websocket", "SPDY/3.1+portforward.k8s.io"),
        ("websocket", "v4.channel.k8s.io, SPDY/3.1+portforward.k8s.io"),
    ],
)
def test_a_port_forward_whose_streams_name_the_ports_cannot_name_others_in_the_query(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes], upgrade: str, protocol: str
) -> None:
    # The kubelet forwards the port a SPDY stream's header names and never reads ?ports=:
    # decided as [8080], allowed, it would reach the database on 5432.
    stripe, kube = fakes
    kube.add_pod("default", "db-0")
    policy = POLICY.replace("upstreams:\n", ONLY_8080, 1)
    with running_sidecar(tmp_path, stripe, kube, policy_text=policy, in_process=True) as sidecar:
        target = f"{kube.url}/api/v1/namespaces/default/pods/db-0/portforward?ports=8080"
        with socket_upgrade(sidecar.proxy_url, target, upgrade, protocol) as sock:
            head = read_head(sock)
        assert head.startswith(b"HTTP/1.1 422"), head
        assert b"X-Ctrlrun-Outcome: invalid_request" in head and kube.sessions == []


def socket_upgrade(proxy: str, target: str, upgrade: str, protocol: str) -> socket.socket:
    """An upgrade through the explicit proxy offering ``protocol``; the socket, head sent."""
    host, port = proxy.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    offered = f"Sec-WebSocket-Protocol: {protocol}\r\n" if protocol else ""
    key = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    head = (
        f"GET {target} HTTP/1.1\r\nHost: {target.split('/')[2]}\r\n"
        f"Authorization: Bearer {KUBE_TOKEN}\r\nConnection: Upgrade\r\nUpgrade: {upgrade}\r\n"
        f"{offered}{key if upgrade == 'websocket' else ''}Content-Length: 0\r\n\r\n"
    )
    sock.sendall(head.encode())
    return sock
