"""Requests through the apiserver's proxies (a pod's, a service's, a node's kubelet), which
reach the application itself, where a GET may act as much as a POST: each spelling, method
and upgrade is refused under either unmapped_writes, reads included, unless one of the
upstream's own routes maps it as written; then it is that route's action, decided."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes.client
import pytest
from harness import KUBE_TOKEN, POLICY, start_sidecar
from kubernetes.client.rest import ApiException
from test_attacks_kube import send
from test_attacks_kube2 import ALLOW_UNMAPPED, DENY_SCALE
from test_attacks_kube4 import kubectl_home
from test_kubectl import KUBECTL, kubectl

from ctrlrun.errors import PolicyError
from ctrlrun.proxy.config import Upstream
from ctrlrun.proxy.config_parse import policy_from_yaml, proxy_config
from ctrlrun.proxy.routes import Invalid, Mapped, PassThrough, Request, map_request
from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(180)

NS = "/api/v1/namespaces/default"
ROADS = [
    f"{NS}/pods/web-0/proxy",
    f"{NS}/pods/web-0/proxy/",
    f"{NS}/pods/web-0/proxy/admin/drop?table=orders",
    f"{NS}/pods/web-0:8080/proxy/admin/drop",
    f"{NS}/pods/https:web-0:8443/proxy/admin/drop",
    f"{NS}/services/billing/proxy/v1/invoices/in_1/void",
    f"{NS}/services/billing:80/proxy/v1/invoices/in_1/void",
    f"{NS}/services/http:billing:/proxy/v1/invoices/in_1/void",
    f"{NS}/services/https:billing:443/proxy/v1/invoices/in_1/void",
    "/api/v1/nodes/node-1/proxy/run/default/web-0/app?cmd=rm",
    "/api/v1/nodes/node-1:10250/proxy/pods",
    # Before Kubernetes 1.10: the same proxies under /api/v1/proxy (and redirect).
    "/api/v1/proxy/namespaces/default/pods/web-0/admin/drop",
    "/api/v1/proxy/namespaces/default/services/billing/v1/invoices/in_1/void",
    "/api/v1/proxy/nodes/node-1/run/default/web-0/app",
    "/api/v1/redirect/namespaces/default/pods/web-0",
    # Spellings Go's apiserver (or a looser one) reads as a proxy path.
    f"{NS}/pods/web-0/prox%79/admin/drop",
    f"{NS}/pods/web-0%2Fproxy/admin/drop",
    f"{NS}/pods/web-0/PROXY/admin/drop",
    f"{NS}/pods/web-0//proxy/admin/drop",
    f"{NS}/pods/web-0/./proxy/admin/drop",
    f"{NS}/pods/web-0/log/../proxy/admin/drop",
    f"{NS}/pods/web-0%5Cproxy/admin/drop",
    "/api/v1/namespaces/default/pods/web-0/proxy%2Fadmin",
]
METHODS = ("GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "get")
SEND = "/api/v1/namespaces/{namespace}/services/billing/proxy/v1/invoices/{invoice_id}/send"
ROUTED = POLICY.replace(
    "    cluster: prod-eu\n",
    "    cluster: prod-eu\n    routes:\n"
    "      - {{method: POST, path: '"
    + SEND.replace("{", "{{").replace("}", "}}")
    + "', action: billing.send_invoice}}\n",
).replace(
    "actions:\n",
    'actions:\n  billing.send_invoice:\n    effect: "send:{{invoice_id}}"\n    decision: allow\n',
    1,
)
FILLED = {
    "stripe": "http://127.0.0.1:1",
    "kube": "https://10.0.0.1:6443",
    "stripe_port": 1,
    "kube_port": 2,
    "timeout": 5,
    "reconcile": "eager",
}


def kube_upstream(text: str) -> Upstream:
    upstreams = proxy_config(policy_from_yaml(text.format(**FILLED))).upstreams
    return next(up for up in upstreams if up.profile == "kubernetes")


KUBE = kube_upstream(POLICY)
ALLOW = kube_upstream(ALLOW_UNMAPPED)
ROUTES = kube_upstream(ROUTED)


def request(method: str, target: str, headers: dict[str, str] | None = None) -> Request:
    path, _, raw = target.partition("?")
    query: dict[str, list[str]] = {}
    for pair in filter(None, raw.split("&")):
        key, _, value = pair.partition("=")
        query.setdefault(key, []).append(value)
    return Request(method, path, query, headers or {}, b"", raw_query=raw)


@pytest.mark.parametrize("target", ROADS)
def test_every_method_through_a_proxy_is_refused_whatever_unmapped_writes_says(
    target: str,
) -> None:
    for upstream in (KUBE, ALLOW, ROUTES):
        for method in METHODS:
            result = map_request(upstream, request(method, target))
            assert isinstance(result, Invalid), (upstream.unmapped_writes, method, result)


@pytest.mark.parametrize(
    "headers",
    [
        {"upgrade": "websocket", "connection": "Upgrade"},
        {"upgrade": "SPDY/3.1", "connection": "Upgrade"},
        {"upgrade": "h2c", "connection": "Upgrade, HTTP2-Settings"},
    ],
)
def test_an_upgrade_through_a_proxy_is_refused_even_where_a_route_maps_it(
    headers: dict[str, str],
) -> None:
    for method in ("GET", "POST"):
        target = f"{NS}/services/billing/proxy/v1/invoices/in_1/send"
        result = map_request(ROUTES, request(method, target, headers))
        assert isinstance(result, Invalid), result
        assert "upgrade" in result.reason


@pytest.mark.parametrize(
    "target",
    [
        "/api/v1/namespaces/proxy",  # a namespace, a pod, a deployment called proxy
        "/api/v1/namespaces/proxy/pods/proxy",
        "/api/v1/namespaces/proxy/pods/proxy/log",
        "/apis/apps/v1/namespaces/proxy/deployments/proxy",
        "/api/v1/namespaces/default/configmaps/proxy",
        "/api/v1/nodes/proxy",
    ],
)
def test_reads_of_objects_named_proxy_are_still_reads(target: str) -> None:
    assert isinstance(map_request(KUBE, request("GET", target)), PassThrough)


def test_a_route_maps_a_call_through_a_services_proxy_as_written() -> None:
    target = f"{NS}/services/billing/proxy/v1/invoices/in_1/send"
    result = map_request(ROUTES, request("POST", target))
    assert result == Mapped("billing.send_invoice", {"namespace": "default", "invoice_id": "in_1"})
    # The same call by another road, method or spelling is no route's: refused.
    for method, other in [
        ("GET", target),
        ("PUT", target),
        ("POST", target.replace("billing", "billing:80")),
        ("POST", target.replace("billing", "http:billing:")),
        ("POST", target.replace("/services/billing/", "/pods/billing-0/")),
        ("POST", target.replace("/send", "/SEND")),
        ("POST", target.replace("/send", "/send.json")),
        (
            "POST",
            target.replace(
                "/api/v1/namespaces/default/services/billing/proxy",
                "/api/v1/proxy/namespaces/default/services/billing",
            ),
        ),
    ]:
        result = map_request(ROUTES, request(method, other))
        assert isinstance(result, Invalid), (method, other, result)


def test_a_routes_parameter_does_not_take_a_name_with_a_port() -> None:
    # "billing", "billing:80" and "http:billing:" are one service: under a {service}
    # parameter each would be an effect key of its own, the same invoice sent three times.
    upstream = kube_upstream(ROUTED.replace("services/billing/proxy", "services/{{service}}/proxy"))
    target = f"{NS}/services/billing/proxy/v1/invoices/in_1/send"
    assert isinstance(map_request(upstream, request("POST", target)), Mapped)
    for name in ("billing:80", "http:billing:", "https:billing:443", "billing%3A80"):
        result = map_request(upstream, request("POST", target.replace("billing", name)))
        assert isinstance(result, Invalid), (name, result)
        assert "port or scheme" in result.reason


@pytest.mark.parametrize(
    ("route", "fragment"),
    [
        ("{method: POST, path: /apis/apps/v1/namespaces/x/deployments/y, action: a}", "proxy"),
        ("{method: POST, path: '/api/v1/namespaces/x/{kind}/y/proxy/z', action: a}", "proxy"),
        ("{method: POST, path: /api/v1/proxy/namespaces/x/pods/y/z, action: a}", "proxy"),
        ("{method: OPTIONS, path: /api/v1/namespaces/x/pods/y/proxy/z, action: a}", "GET"),
        (
            "{method: POST, path: /api/v1/namespaces/x/pods/y/proxy/z, action: a, "
            "reconcile: {get: /z, committed: {a: 1}, not_executed: {a: 2}}}",
            "reconcile",
        ),
    ],
)
def test_a_kubernetes_route_must_be_a_path_through_a_proxy(route: str, fragment: str) -> None:
    text = (
        "schema: ctrlrun.policy/v2\nactions:\n  a: {decision: allow}\nupstreams:\n"
        f"  k:\n    profile: kubernetes\n    url: https://k.test\n    routes: [{route}]\n"
    )
    with pytest.raises(PolicyError) as info:
        policy_from_yaml(text, source="p.yaml")
    assert "upstreams.k.routes" in str(info.value) and fragment in str(info.value)


def test_a_get_route_is_a_kubernetes_upstreams_only() -> None:
    text = (
        "schema: ctrlrun.policy/v2\nactions:\n  a: {decision: allow}\nupstreams:\n"
        "  h:\n    profile: http\n    url: https://h.test\n"
        "    routes: [{method: GET, path: /api/v1/namespaces/x/pods/y/proxy/z, action: a}]\n"
    )
    with pytest.raises(PolicyError, match="reads pass through"):
        policy_from_yaml(text, source="p.yaml")
    upstream = kube_upstream(ROUTED.replace("method: POST", "method: GET"))
    target = f"{NS}/services/billing/proxy/v1/invoices/in_1/send"
    assert isinstance(map_request(upstream, request("GET", target)), Mapped)


def core_api(base: str) -> kubernetes.client.CoreV1Api:
    cfg = kubernetes.client.Configuration(
        host=base,
        api_key={"authorization": KUBE_TOKEN},
        api_key_prefix={"authorization": "Bearer"},
    )
    cfg.proxy = None
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(cfg))


@pytest.mark.parametrize("policy", [POLICY, ALLOW_UNMAPPED], ids=["deny", "allow"])
def test_no_request_through_a_proxy_reaches_the_application(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes], policy: str
) -> None:
    kube = fakes[1]
    kube.add_pod("default", "web-0")
    sidecar = start_sidecar(tmp_path, *fakes, policy_text=policy, in_process=True)
    try:
        for method in ("GET", "HEAD", "POST", "PUT", "DELETE"):
            for target in (ROADS[2], ROADS[3], ROADS[6], ROADS[-1]):
                status, got, text = send(sidecar.kube_base, method, target, [])
                assert got.get("x-ctrlrun-outcome") == "invalid_request", (method, target)
                assert status == 422, (status, text)
        # The official client's proxy calls, a read and a write alike.
        api = core_api(sidecar.kube_base)
        for call in (
            lambda: api.connect_get_namespaced_pod_proxy_with_path("web-0", "default", "admin"),
            lambda: api.connect_post_namespaced_service_proxy_with_path(
                "billing", "default", "v1/invoices/in_1/send"
            ),
            lambda: api.connect_delete_namespaced_pod_proxy("web-0", "default", path="x"),
        ):
            with pytest.raises(ApiException) as info:
                call()
            # Its path parameter goes out with each '/' as %2F, which Go's apiserver decodes
            # as a separator: refused as ambiguous, when not as a proxy's.
            assert info.value.status == 422
            assert "request refused" in json.loads(info.value.body)["message"]
        if KUBECTL is not None:
            home = kubectl_home(sidecar, tmp_path)
            done, _ = kubectl(home, "get", "--raw", f"{NS}/services/billing:80/proxy/admin")
            assert done.returncode != 0 and "apiserver's proxy" in done.stderr, done.stderr
        assert kube.proxied == []
        assert all("proxy" not in path for _, path in kube.requests)
        # The apiserver's own reads still pass.
        status, _, _ = send(sidecar.kube_base, "GET", f"{NS}/pods/web-0", [])
        assert status == 200
    finally:
        sidecar.stop()


def test_a_routed_call_through_a_services_proxy_is_decided_once(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]
) -> None:
    kube = fakes[1]
    sidecar = start_sidecar(tmp_path, *fakes, policy_text=ROUTED, in_process=True)
    try:
        target = f"{NS}/services/billing/proxy/v1/invoices/in_1/send"
        status, got, text = send(sidecar.kube_base, "POST", target, [])
        assert status == 200, (status, text)
        assert kube.proxied == [("POST", target)]
        # The same invoice again, as written or by the service's other names: not sent again.
        for again in (target, target.replace("billing", "billing:80"), f"{NS}/pods/b-0/proxy"):
            status, got, text = send(sidecar.kube_base, "POST", again, [])
            assert status >= 400 and got.get("x-ctrlrun-outcome") != "committed", (again, text)
        assert kube.proxied == [("POST", target)]
        assert sidecar.effect_state("send:in_1") == "committed"
    finally:
        sidecar.stop()


APPS = "/apis/apps/v1/namespaces/default"
KEDA = "/apis/keda.sh/v1alpha1/namespaces/default/scaledobjects"
VPA = "/apis/autoscaling.k8s.io/v1/namespaces/default/verticalpodautoscalers"
RC = f"{NS}/replicationcontrollers/legacy"
CRD = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MERGE = "application/merge-patch+json"
TO_50 = {"spec": {"replicas": 50}}
SCALED = {
    "apiVersion": "keda.sh/v1alpha1",
    "kind": "ScaledObject",
    "metadata": {"name": "checkout"},
    "spec": {"scaleTargetRef": {"name": "checkout"}, "minReplicaCount": 50},
}
CASCADES: list[tuple[str, str, str, object]] = [
    # A StatefulSet's or ReplicaSet's delete takes its pods, cascading or not.
    ("DELETE", f"{APPS}/statefulsets/pg", "", None),
    ("DELETE", f"{APPS}/replicasets/checkout-7d9f", "application/json", {"kind": "DeleteOptions"}),
    ("DELETE", f"{APPS}/statefulsets/pg?propagationPolicy=Orphan", "", None),
    ("DELETE", f"{APPS}/statefulsets/pg?dryRun=All", "", None),
    # Every object of a kind, and what they own (an operator's deployments).
    ("DELETE", f"{CRD}/databases.example.com", "", None),
    ("DELETE", f"{CRD}?labelSelector=app%3Ddb", "", None),
    ("DELETE", CRD.replace("/v1/", "/v1beta1/") + "/databases.example.com", "", None),
    # Other controllers that set replicas: KEDA (a delete restores the original count), VPA.
    ("POST", KEDA, "application/json", SCALED),
    ("PATCH", f"{KEDA}/checkout", MERGE, {"spec": {"minReplicaCount": 50}}),
    ("DELETE", f"{KEDA}/checkout", "", None),
    ("PUT", f"{VPA}/checkout", "application/json", {"spec": {"updatePolicy": {}}}),
    # The scale of anything but an apps/v1 workload: a custom resource, a legacy RC.
    ("PATCH", "/apis/example.com/v1/namespaces/default/databases/pg/scale", MERGE, TO_50),
    ("PUT", "/apis/example.com/v1/clusters/pg/scale", "application/json", TO_50),
    (
        "PATCH",
        "/apis/extensions/v1beta1/namespaces/default/replicationcontrollers/x/scale",
        MERGE,
        TO_50,
    ),
    ("PATCH", f"{RC}/scale", MERGE, TO_50),
    ("PATCH", RC, MERGE, TO_50),
    ("DELETE", RC, "", None),
]


@pytest.mark.parametrize(("method", "target", "kind", "body"), CASCADES)
def test_a_cascade_or_another_scale_is_refused_under_unmapped_writes_allow(
    tmp_path: Path,
    fakes: tuple[FakeStripe, FakeKubernetes],
    method: str,
    target: str,
    kind: str,
    body: object,
) -> None:
    kube = fakes[1]
    sidecar = start_sidecar(tmp_path, *fakes, policy_text=ALLOW_UNMAPPED, in_process=True)
    try:
        data = b"" if body is None else json.dumps(body).encode()
        headers = [("Content-Type", kind)] if kind else []
        status, got, text = send(sidecar.kube_base, method, target, headers, data)
        assert got.get("x-ctrlrun-outcome") == "invalid_request", (status, text)
        assert status == 422
        assert kube.requests == [] and kube.dry_runs == []
        # A label of the same RC is metadata, an unmapped write that still goes (a 404 here).
        if target == RC and method == "PATCH":
            labelled = json.dumps({"metadata": {"labels": {"a": "b"}}}).encode()
            send(sidecar.kube_base, "PATCH", RC, [("Content-Type", MERGE)], labelled)
            assert kube.count("PATCH") == 1
    finally:
        sidecar.stop()


@pytest.mark.parametrize(
    ("target", "kind", "body"),
    [
        # JSON patch operations that land on /spec/replicas without naming it as a value.
        (
            f"{APPS}/deployments/checkout",
            "application/json-patch+json",
            [
                {"op": "add", "path": "/spec/minReadySeconds", "value": 50},
                {"op": "move", "from": "/spec/minReadySeconds", "path": "/spec/replicas"},
            ],
        ),
        (
            f"{APPS}/deployments/checkout",
            "application/json-patch+json",
            [
                {"op": "add", "path": "/spec/minReadySeconds", "value": 50},
                {"op": "copy", "from": "/spec/minReadySeconds", "path": "/spec/replicas"},
                {"op": "remove", "path": "/spec/minReadySeconds"},
            ],
        ),
        (
            f"{APPS}/deployments/checkout/scale?fieldManager=agent",
            "application/json-patch+json",
            [
                {"op": "copy", "from": "/spec/replicas", "path": "/metadata/x"},
                {"op": "replace", "path": "/spec/replicas", "value": 50},
            ],
        ),
        (
            f"{APPS}/deployments/checkout?fieldManager=agent&force=true",
            "application/apply-patch+yaml",
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "checkout"},
                "spec": {"replicas": 50},
            },
        ),
    ],
)
def test_a_patch_that_lands_on_replicas_is_decided_as_the_scale_it_is(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes], target: str, kind: str, body: object
) -> None:
    kube = fakes[1]
    sidecar = start_sidecar(tmp_path, *fakes, policy_text=DENY_SCALE, in_process=True)
    try:
        data = json.dumps(body).encode()
        status, got, text = send(sidecar.kube_base, "PATCH", target, [("Content-Type", kind)], data)
        assert got.get("x-ctrlrun-outcome") == "denied", (status, text)
        assert kube.replicas("default", "checkout") == 3
        assert kube.writes_applied == 0
    finally:
        sidecar.stop()


@pytest.mark.parametrize("policy", [POLICY, ALLOW_UNMAPPED], ids=["deny", "allow"])
def test_an_exec_without_upgrade_runs_nothing_by_any_old_road(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes], policy: str
) -> None:
    # GET exec with no Upgrade is a read the apiserver answers 400 (it needs an upgrade);
    # POST is decided as the exec it may be (undeclared here: denied); the forms before
    # Kubernetes 1.10 go through a proxy and are refused.
    kube = fakes[1]
    kube.add_pod("default", "web-0")
    sidecar = start_sidecar(tmp_path, *fakes, policy_text=policy, in_process=True)
    try:
        exec_ = f"{NS}/pods/web-0/exec?command=rm&command=-rf&command=/data"
        status, _, text = send(sidecar.kube_base, "GET", exec_, [])
        assert status == 400 and b"Upgrade request required" in text, (status, text)
        status, got, text = send(sidecar.kube_base, "POST", exec_, [])
        assert got.get("x-ctrlrun-outcome") == "denied", (status, text)
        for method in ("GET", "POST"):
            for old in (
                "/api/v1/proxy/namespaces/default/pods/web-0/exec?command=rm",
                "/api/v1/proxy/nodes/node-1/exec/default/web-0/app?command=rm",
                "/api/v1/redirect/namespaces/default/pods/web-0",
            ):
                status, got, _ = send(sidecar.kube_base, method, old, [])
                assert got.get("x-ctrlrun-outcome") == "invalid_request" and status == 422
        assert kube.sessions == []
        assert [m for m, _ in kube.requests] == ["GET"]  # the 400 above, nothing else
    finally:
        sidecar.stop()
