"""The shipped pod's agent holds no cluster token: the sidecar sends its own, and only to the
Kubernetes upstream it recognised (official Python client, real proxy, fake apiserver)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from harness import POLICY, Sidecar, running_sidecar

from ctrlrun.testing import FakeKubernetes, FakeStripe
from ctrlrun.testing.messages import Request, Response

pytestmark = pytest.mark.timeout(90)
SA_TOKEN = "sa-token-held-by-the-sidecar"


class RecordingKubernetes(FakeKubernetes):
    """A fake apiserver that remembers the ``Authorization`` of every request."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str | None] = []

    def authorize(self, request: Request) -> Response | None:
        self.seen.append(request.headers.get("authorization"))
        return None


@pytest.fixture
def kube() -> Iterator[RecordingKubernetes]:
    with RecordingKubernetes() as fake:
        fake.add_deployment(namespace="default", name="checkout", replicas=3)
        yield fake


@pytest.fixture
def sc(tmp_path: Path, kube: RecordingKubernetes) -> Iterator[Sidecar]:
    token = tmp_path / "token"
    token.write_text(SA_TOKEN + "\n")
    anchor = "    cluster: prod-eu\n"
    text = POLICY.replace(anchor, f"{anchor}    token_file: {token}\n")
    with (
        FakeStripe() as stripe_fake,
        running_sidecar(
            tmp_path / "sc", stripe_fake, kube, policy_text=text, in_process=True
        ) as sidecar,
    ):
        yield sidecar


def apps(base: str, token: str | None = None, proxy: str | None = None) -> Any:
    cfg = kubernetes.client.Configuration(host=base)
    if token:
        cfg.api_key = {"authorization": token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
    cfg.proxy = proxy
    return kubernetes.client.AppsV1Api(kubernetes.client.ApiClient(cfg))


def test_the_agent_without_a_token_is_sent_with_the_sidecars(
    sc: Sidecar, kube: RecordingKubernetes
) -> None:
    api = apps(sc.kube_base)
    body = {"spec": {"replicas": 5}}
    api.patch_namespaced_deployment_scale("checkout", "default", body, _request_timeout=30)
    assert api.read_namespaced_deployment("checkout", "default", _request_timeout=30)
    # The write, the read, and whatever the sidecar itself asked to decide the write.
    assert len(kube.seen) >= 2 and set(kube.seen) == {f"Bearer {SA_TOKEN}"}, kube.seen
    assert sc.effect_state("scale:prod-eu:checkout:5") == "committed"


def test_the_agents_own_token_is_kept(sc: Sidecar, kube: RecordingKubernetes) -> None:
    apps(sc.kube_base, token="agent-token").read_namespaced_deployment(
        "checkout", "default", _request_timeout=30
    )
    assert kube.seen == ["Bearer agent-token"]


def test_a_host_that_is_no_upstream_never_gets_the_token(sc: Sidecar) -> None:
    with RecordingKubernetes() as other:
        other.add_deployment(namespace="default", name="checkout", replicas=3)
        apps(other.url, proxy=sc.proxy_url).read_namespaced_deployment(
            "checkout", "default", _request_timeout=30
        )
        assert other.seen == [None]
