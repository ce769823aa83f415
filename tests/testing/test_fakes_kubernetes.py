"""The fake Kubernetes apiserver: driven with httpx, the official Python client and kubectl."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from ctrlrun.testing import FakeKubernetes

DEPLOY = "/apis/apps/v1/namespaces/default/deployments/checkout"
SCALE = DEPLOY + "/scale"
MERGE = {"Content-Type": "application/merge-patch+json"}
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
Completed = subprocess.CompletedProcess[str]


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes(hang_seconds=0.5) as server:
        server.add_deployment(namespace="default", name="checkout", replicas=3)
        yield server


@pytest.fixture
def http(fake: FakeKubernetes) -> Iterator[httpx.Client]:
    headers = {"Authorization": "Bearer any-token"}
    with httpx.Client(base_url=fake.url, headers=headers, timeout=5, trust_env=False) as client:
        yield client


def api_client(fake: FakeKubernetes) -> k8s.ApiClient:
    config = k8s.Configuration()
    config.host = fake.url
    config.api_key = {"authorization": "Bearer any-token"}
    config.retries = False  # urllib3 would re-send PUT/DELETE after a read error
    if fake.ca_file is not None:
        config.ssl_ca_cert = str(fake.ca_file)
    return k8s.ApiClient(config)


def assert_status(answer: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    assert answer.status_code == code
    body: dict[str, Any] = answer.json()
    assert (body["kind"], body["apiVersion"], body["status"]) == ("Status", "v1", "Failure")
    assert (body["code"], body["reason"]) == (code, reason) and body["message"]
    return body


# -- objects, discovery, errors ----------------------------------------------------------------


def test_discovery_documents(http: httpx.Client) -> None:
    assert http.get("/version").json()["gitVersion"].startswith("v1.")
    assert http.get("/api").json()["versions"] == ["v1"]
    groups = {g["name"] for g in http.get("/apis").json()["groups"]}
    assert groups == {"apps", "autoscaling"}
    resources = {r["name"]: r for r in http.get("/apis/apps/v1").json()["resources"]}
    assert resources["deployments/scale"]["kind"] == "Scale"
    assert resources["deployments/scale"]["group"] == "autoscaling"
    assert "namespaces" in {r["name"] for r in http.get("/api/v1").json()["resources"]}


def test_deployment_object(fake: FakeKubernetes, http: httpx.Client) -> None:
    body = http.get(DEPLOY).json()
    assert (body["kind"], body["apiVersion"]) == ("Deployment", "apps/v1")
    meta = body["metadata"]
    assert (meta["name"], meta["namespace"], meta["generation"]) == ("checkout", "default", 1)
    assert meta["uid"] and meta["resourceVersion"].isdigit()
    assert body["spec"]["replicas"] == 3 and body["status"]["replicas"] == 3
    assert fake.replicas("default", "checkout") == 3
    listed = http.get("/apis/apps/v1/namespaces/default/deployments").json()
    assert listed["kind"] == "DeploymentList" and [
        i["metadata"]["name"] for i in listed["items"]
    ] == ["checkout"]


def test_unknown_paths_and_methods(http: httpx.Client) -> None:
    assert_status(http.get("/apis/batch/v1/jobs"), 404, "NotFound")
    assert_status(http.post(SCALE, json={}), 405, "MethodNotAllowed")
    body = assert_status(http.get(DEPLOY.replace("checkout", "nope")), 404, "NotFound")
    assert body["details"] == {"name": "nope", "group": "apps", "kind": "deployments"}


# -- scale and patches -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/merge-patch+json", {"spec": {"replicas": 6}}),
        ("application/strategic-merge-patch+json", {"spec": {"replicas": 6}}),
        ("application/json-patch+json", [{"op": "replace", "path": "/spec/replicas", "value": 6}]),
        (
            "application/json-patch+json",
            [
                {"op": "test", "path": "/spec/replicas", "value": 3},
                {"op": "add", "path": "/spec/replicas", "value": 6},
            ],
        ),
    ],
)
@pytest.mark.parametrize("path", [SCALE, DEPLOY])
def test_patch_replicas(
    fake: FakeKubernetes, http: httpx.Client, path: str, content_type: str, body: Any
) -> None:
    before = fake.deployment("default", "checkout")["metadata"]
    answer = http.patch(path, content=json.dumps(body), headers={"Content-Type": content_type})
    assert answer.status_code == 200 and answer.json()["spec"]["replicas"] == 6
    after = fake.deployment("default", "checkout")["metadata"]
    assert fake.replicas("default", "checkout") == 6
    assert after["generation"] == before["generation"] + 1
    assert int(after["resourceVersion"]) > int(before["resourceVersion"])
    assert fake.writes_applied == 1


def test_scale_object_and_a_no_op_patch(fake: FakeKubernetes, http: httpx.Client) -> None:
    scale = http.get(SCALE).json()
    assert (scale["kind"], scale["apiVersion"]) == ("Scale", "autoscaling/v1")
    assert scale["spec"]["replicas"] == 3 and scale["status"]["selector"] == "app=checkout"
    same = http.patch(SCALE, json={"spec": {"replicas": 3}}, headers=MERGE).json()
    assert same["metadata"]["resourceVersion"] == scale["metadata"]["resourceVersion"]


@pytest.mark.parametrize(
    ("content_type", "body", "code", "reason"),
    [
        ("application/merge-patch+json", {"spec": {"replicas": -1}}, 422, "Invalid"),
        ("application/merge-patch+json", {"spec": {"replicas": "six"}}, 422, "Invalid"),
        (
            "application/json-patch+json",
            [{"op": "test", "path": "/spec/replicas", "value": 5}],
            422,
            "Invalid",
        ),
        ("application/merge-patch+json", [1], 400, "BadRequest"),
        ("text/plain", {"spec": {"replicas": 6}}, 415, "UnsupportedMediaType"),
        (
            "application/merge-patch+json",
            {"metadata": {"resourceVersion": "1"}, "spec": {"replicas": 6}},
            409,
            "Conflict",
        ),
    ],
)
def test_bad_patches_change_nothing(
    fake: FakeKubernetes, http: httpx.Client, content_type: str, body: Any, code: int, reason: str
) -> None:
    answer = http.patch(SCALE, content=json.dumps(body), headers={"Content-Type": content_type})
    assert_status(answer, code, reason)
    assert fake.replicas("default", "checkout") == 3 and fake.writes_applied == 0


def test_put_scale_honours_resource_version(fake: FakeKubernetes, http: httpx.Client) -> None:
    scale = http.get(SCALE).json()
    scale["spec"]["replicas"] = 5
    assert http.put(SCALE, json=scale).json()["spec"]["replicas"] == 5
    scale["spec"]["replicas"] = 9  # scale still carries the old resourceVersion
    body = assert_status(http.put(SCALE, json=scale), 409, "Conflict")
    assert "the object has been modified" in body["message"]
    del scale["metadata"]["resourceVersion"]
    assert http.put(SCALE, json=scale).json()["spec"]["replicas"] == 9
    assert fake.writes_applied == 2


def test_put_and_delete_deployment(fake: FakeKubernetes, http: httpx.Client) -> None:
    deployment = http.get(DEPLOY).json()
    deployment["spec"]["replicas"] = 4
    updated = http.put(DEPLOY, json=deployment).json()
    assert updated["metadata"]["generation"] == 2
    assert_status(http.put(DEPLOY, json=deployment), 409, "Conflict")
    wrong_uid = {"preconditions": {"uid": "not-it"}}
    assert_status(http.request("DELETE", DEPLOY, json=wrong_uid), 409, "Conflict")
    gone = http.delete(DEPLOY).json()
    assert (gone["kind"], gone["status"]) == ("Status", "Success")
    assert gone["details"]["uid"] == deployment["metadata"]["uid"]
    assert_status(http.get(DEPLOY), 404, "NotFound")
    assert_status(http.delete(DEPLOY), 404, "NotFound")
    assert fake.deployments == {} and fake.writes_applied == 2


def test_dry_run_changes_nothing(fake: FakeKubernetes, http: httpx.Client) -> None:
    answer = http.patch(
        SCALE, params={"dryRun": "All"}, json={"spec": {"replicas": 8}}, headers=MERGE
    )
    assert answer.json()["spec"]["replicas"] == 8
    assert fake.replicas("default", "checkout") == 3 and fake.writes_applied == 0


# -- namespaces and watches --------------------------------------------------------------------


def test_namespace_deletion_lifecycle(fake: FakeKubernetes, http: httpx.Client) -> None:
    fake.add_namespace("shop")
    fake.add_deployment(namespace="shop", name="cart", replicas=1)
    first = http.delete("/api/v1/namespaces/shop")
    assert first.status_code == 200
    body = first.json()
    assert body["kind"] == "Namespace" and body["metadata"]["deletionTimestamp"]
    assert body["status"]["phase"] == "Terminating"
    again = assert_status(http.delete("/api/v1/namespaces/shop"), 409, "Conflict")
    assert "ensuring all content is removed" in again["message"]
    assert http.get("/api/v1/namespaces/shop").json()["status"]["phase"] == "Terminating"
    fake.finish_namespace_deletion("shop")
    assert_status(http.get("/api/v1/namespaces/shop"), 404, "NotFound")
    assert ("shop", "cart") not in fake.deployments
    assert_status(http.delete("/api/v1/namespaces/default"), 403, "Forbidden")
    names = [n["metadata"]["name"] for n in http.get("/api/v1/namespaces").json()["items"]]
    assert names == ["default"] and fake.writes_applied == 1


def test_namespaces_can_finish_by_themselves() -> None:
    with FakeKubernetes(finalize_namespaces_after=0.2) as fake:
        fake.add_namespace("tmp")
        assert httpx.delete(f"{fake.url}/api/v1/namespaces/tmp").status_code == 200
        assert "tmp" in fake.namespaces
        time.sleep(0.3)
        assert "tmp" not in fake.namespaces


def test_watch_reports_a_deletion(fake: FakeKubernetes) -> None:
    fake.add_namespace("doomed")
    params = {"watch": "true", "fieldSelector": "metadata.name=doomed", "timeoutSeconds": "5"}
    events = []
    with httpx.stream("GET", f"{fake.url}/api/v1/namespaces", params=params, timeout=10) as stream:
        for line in stream.iter_lines():
            events.append(json.loads(line))
            if events[-1]["type"] == "ADDED":  # the watch is open: now delete it
                threading.Timer(0.1, fake.finish_namespace_deletion, args=("doomed",)).start()
            if events[-1]["type"] == "DELETED":
                break
    assert [e["type"] for e in events] == ["ADDED", "DELETED"]
    assert events[-1]["object"]["metadata"]["name"] == "doomed"


def test_server_side_table_for_kubectl(http: httpx.Client) -> None:
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    table = http.get(DEPLOY, headers={"Accept": accept}).json()
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]][:2] == ["Name", "Ready"]
    assert table["rows"][0]["cells"][:2] == ["checkout", "3/3"]


# -- the official Python client -----------------------------------------------------------------


def test_python_client(fake: FakeKubernetes) -> None:
    fake.add_namespace("scratch")
    with api_client(fake) as api:
        apps, core = k8s.AppsV1Api(api), k8s.CoreV1Api(api)
        assert apps.read_namespaced_deployment("checkout", "default").spec.replicas == 3
        scaled = apps.patch_namespaced_deployment_scale(
            "checkout", "default", {"spec": {"replicas": 5}}
        )
        assert scaled.spec.replicas == 5
        current = apps.read_namespaced_deployment_scale("checkout", "default")
        current.metadata.resource_version = "1"
        current.spec.replicas = 7
        with pytest.raises(ApiException) as conflict:
            apps.replace_namespaced_deployment_scale("checkout", "default", current)
        assert conflict.value.status == 409
        core.delete_namespace("scratch")
        assert core.read_namespace("scratch").status.phase == "Terminating"
        with pytest.raises(ApiException) as again:
            core.delete_namespace("scratch")
        assert again.value.status == 409
        fake.finish_namespace_deletion("scratch")
        with pytest.raises(ApiException) as gone:
            core.read_namespace("scratch")
        assert gone.value.status == 404
    assert fake.replicas("default", "checkout") == 5 and fake.writes_applied == 2


def test_tls_mode() -> None:
    with FakeKubernetes(tls=True) as fake:
        fake.add_deployment()
        assert fake.url.startswith("https://") and fake.ca_file is not None
        trust = ssl.create_default_context(cafile=str(fake.ca_file))
        assert httpx.get(f"{fake.url}{DEPLOY}", verify=trust).status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{fake.url}{DEPLOY}")
        with api_client(fake) as api:
            assert k8s.AppsV1Api(api).read_namespaced_deployment_scale("checkout", "default")


# -- failure injection -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "reason"),
    [(404, "NotFound"), (409, "Conflict"), (429, "TooManyRequests"), (500, "InternalError"),
     (503, "ServiceUnavailable"), (504, "Timeout")],
)  # fmt: skip
def test_injected_statuses_are_status_objects(
    fake: FakeKubernetes, http: httpx.Client, status: int, reason: str
) -> None:
    fake.fail_next(status)
    assert http.get(SCALE).status_code == 200  # reads do not consume it
    assert_status(http.patch(SCALE, json={"spec": {"replicas": 6}}, headers=MERGE), status, reason)
    assert fake.replicas("default", "checkout") == 3
    assert "Retry-After" not in http.get(SCALE).headers


def test_commit_then_drop_and_reset_before(fake: FakeKubernetes, http: httpx.Client) -> None:
    fake.fail_next("commit_then_drop")
    with pytest.raises(httpx.RemoteProtocolError):
        http.patch(SCALE, json={"spec": {"replicas": 6}}, headers=MERGE)
    assert fake.replicas("default", "checkout") == 6 and fake.writes_applied == 1
    fake.fail_next("reset_before")
    with pytest.raises(httpx.ReadError):
        http.patch(SCALE, json={"spec": {"replicas": 7}}, headers=MERGE)
    fake.fail_next("hang")
    with pytest.raises(httpx.RemoteProtocolError):
        http.delete("/api/v1/namespaces/default")
    assert fake.replicas("default", "checkout") == 6 and fake.writes_applied == 1


def test_read_failures_for_reconcilers(fake: FakeKubernetes, http: httpx.Client) -> None:
    fake.fail_reads(503, path=SCALE)
    assert_status(http.get(SCALE), 503, "ServiceUnavailable")
    assert http.get(DEPLOY).status_code == 200
    assert http.patch(SCALE, json={"spec": {"replicas": 4}}, headers=MERGE).status_code == 200
    assert_status(http.get(SCALE), 503, "ServiceUnavailable")
    fake.fail_reads(None)
    assert http.get(SCALE).json()["spec"]["replicas"] == 4
    fake.fail_reads("drop", times=1)
    with pytest.raises(httpx.RemoteProtocolError):
        http.get(SCALE)
    started = time.monotonic()
    fake.fail_reads("hang", times=1)
    with pytest.raises(httpx.RemoteProtocolError):
        http.get(SCALE)
    assert 0.4 <= time.monotonic() - started < 4
    assert http.get(SCALE).status_code == 200


# -- kubectl -------------------------------------------------------------------------------------


@pytest.fixture
def kubectl(
    fake: FakeKubernetes, tmp_path: Path
) -> Callable[..., subprocess.CompletedProcess[str]]:
    if not os.path.exists(KUBECTL):
        pytest.skip("kubectl is not installed")
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
        f"clusters: [{{name: fake, cluster: {{server: '{fake.url}'}}}}]\n"
        "users: [{name: agent, user: {token: not-a-real-token}}]\n"
        "contexts: [{name: fake, context: {cluster: fake, user: agent, namespace: default}}]\n"
    )
    env = {"KUBECONFIG": str(config), "HOME": str(tmp_path), "PATH": os.environ.get("PATH", "")}

    def run(*args: str) -> Completed:
        command = [KUBECTL, "--request-timeout=10s", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)

    return run


def test_kubectl_scale_and_get(fake: FakeKubernetes, kubectl: Callable[..., Any]) -> None:
    scaled = kubectl("scale", "deployment/checkout", "--replicas=6")
    assert scaled.returncode == 0, scaled.stderr
    assert "deployment.apps/checkout scaled" in scaled.stdout
    assert fake.replicas("default", "checkout") == 6
    assert fake.count("PATCH") == 1 and fake.writes_applied == 1
    shown = kubectl("get", "deployment", "checkout")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split("\n")[1].split()[:2] == ["checkout", "6/6"]
    as_json = json.loads(kubectl("get", "deployment", "checkout", "-o", "json").stdout)
    assert as_json["spec"]["replicas"] == 6


def test_kubectl_with_injected_write_failures(
    fake: FakeKubernetes, kubectl: Callable[..., Any]
) -> None:
    fake.fail_next(500)
    failed = kubectl("scale", "deployment/checkout", "--replicas=6")
    assert failed.returncode != 0 and fake.replicas("default", "checkout") == 3
    fake.fail_next("commit_then_drop")
    dropped = kubectl("scale", "deployment/checkout", "--replicas=6")
    assert dropped.returncode != 0 and fake.replicas("default", "checkout") == 6
    assert fake.count("PATCH") == 2


def test_kubectl_delete_namespace(fake: FakeKubernetes, kubectl: Callable[..., Any]) -> None:
    fake.add_namespace("scratch")
    deleted = kubectl("delete", "namespace", "scratch", "--wait=false")
    assert deleted.returncode == 0, deleted.stderr
    assert 'namespace "scratch" deleted' in deleted.stdout
    assert fake.namespace("scratch")["status"]["phase"] == "Terminating"
    again = kubectl("delete", "namespace", "scratch", "--wait=false")
    assert again.returncode != 0 and "Conflict" in again.stderr
    fake.add_namespace("waited")
    threading.Timer(0.5, fake.finish_namespace_deletion, args=("waited",)).start()
    waited = kubectl("delete", "namespace", "waited")  # waits (watch) until it is gone
    assert waited.returncode == 0, waited.stderr
    assert "waited" not in fake.namespaces
