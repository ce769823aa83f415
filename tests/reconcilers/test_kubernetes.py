"""KubernetesReconciler against the real fake apiserver on loopback."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from ctrlrun.reconcilers import EffectFacts, KubernetesReconciler, KubernetesTarget
from ctrlrun.reconcilers.http import SETTLE_MARGIN
from ctrlrun.testing import FakeKubernetes

Seed = Callable[[FakeKubernetes], None]


def facts(action: str, arguments: dict[str, Any], **kw: Any) -> EffectFacts:
    kw.setdefault("credentials", {"authorization": "Bearer agent-token"})
    return EffectFacts(
        effect_key=f"{action}:effect",
        action=action,
        arguments=arguments,
        **{"attempt_started_at": datetime.now(UTC), "clock": after_the_window, **kw},
    )


def after_the_window() -> datetime:
    """Asked once the attempt's settle window is over (``test_settle_window`` asks inside it)."""
    return datetime.now(UTC) + timedelta(minutes=10)


def deployment(namespace: str = "default", name: str = "web", replicas: int = 3) -> Seed:
    def seed(fake: FakeKubernetes) -> None:
        fake.add_deployment(namespace, name, replicas)

    return seed


def delete(path: str) -> Seed:
    def seed(fake: FakeKubernetes) -> None:
        with httpx.Client(trust_env=False) as client:
            client.delete(fake.url + path).raise_for_status()

    return seed


def finish(name: str) -> Seed:
    return lambda fake: fake.finish_namespace_deletion(name)


def namespace(name: str) -> Seed:
    def seed(fake: FakeKubernetes) -> None:
        fake.add_namespace(name)

    return seed


NS_PATH = "/api/v1/namespaces/shop"
DEPLOY_PATH = "/apis/apps/v1/namespaces/prod/deployments/web"


@pytest.mark.parametrize(
    ("seeds", "action", "arguments", "expected"),
    [
        pytest.param(
            [deployment(replicas=6)],
            "k8s.scale",
            {"cluster": "eu", "namespace": "default", "deployment": "web", "replicas": 6},
            "committed",
            id="scale-applied",
        ),
        pytest.param(
            [deployment(replicas=6)],
            "k8s.scale",
            {"deployment": "web", "replicas": "6"},
            "committed",
            id="scale-default-namespace-digits",
        ),
        pytest.param(
            [deployment(replicas=3)],
            "k8s.scale",
            {"namespace": "default", "deployment": "web", "replicas": 6},
            "not_executed",
            id="scale-not-applied",
        ),
        pytest.param(
            [],
            "k8s.scale",
            {"namespace": "default", "deployment": "web", "replicas": 6},
            "not_executed",
            id="scale-no-deployment",
        ),
        pytest.param(
            [deployment()],
            "k8s.scale",
            {"deployment": "web", "replicas": 6.0},
            "unknown",
            id="scale-bad-replicas",
        ),
        pytest.param(
            [deployment("prod")],
            "k8s.delete_deployment",
            {"namespace": "prod", "deployment": "web"},
            "not_executed",
            id="deployment-still-there",
        ),
        pytest.param(
            [deployment("prod"), delete(DEPLOY_PATH)],
            "k8s.delete_deployment",
            {"namespace": "prod", "deployment": "web"},
            "committed",
            id="deployment-gone",
        ),
        pytest.param(
            [namespace("shop")],
            "k8s.delete_namespace",
            {"name": "shop"},
            "not_executed",
            id="namespace-still-there",
        ),
        pytest.param(
            [namespace("shop"), delete(NS_PATH)],
            "k8s.delete_namespace",
            {"name": "shop"},
            "committed",
            id="namespace-terminating",
        ),
        pytest.param(
            [namespace("shop"), delete(NS_PATH), finish("shop")],
            "k8s.delete_namespace",
            {"name": "shop"},
            "committed",
            id="namespace-gone",
        ),
        pytest.param([], "k8s.delete_namespace", {"name": ".."}, "unknown", id="bad-name"),
        pytest.param([], "k8s.patch", {"name": "x"}, "unknown", id="other-action"),
    ],
)
def test_answers(
    kube_fake: FakeKubernetes,
    seeds: list[Seed],
    action: str,
    arguments: dict[str, Any],
    expected: str,
) -> None:
    for seed in seeds:
        seed(kube_fake)
    kube_fake.reset_counts()
    assert KubernetesReconciler(kube_fake.url)(facts(action, arguments)) == expected
    assert {m for m, _ in kube_fake.requests} <= {"GET"}
    assert kube_fake.writes_applied == 0


QUESTIONS = [
    ("k8s.scale", {"namespace": "default", "deployment": "web", "replicas": 3}),
    ("k8s.delete_deployment", {"namespace": "default", "deployment": "web"}),
    ("k8s.delete_namespace", {"name": "default"}),
]


@pytest.mark.parametrize("failure", ["500", "503", "unreachable", "timeout", "drop"])
@pytest.mark.parametrize(("action", "arguments"), QUESTIONS, ids=[q[0] for q in QUESTIONS])
def test_failures_are_unknown(
    kube_fake: FakeKubernetes,
    closed_url: str,
    failure: str,
    action: str,
    arguments: dict[str, Any],
) -> None:
    kube_fake.add_deployment("default", "web", 3)
    kube_fake.hang_seconds = 5
    url = closed_url if failure == "unreachable" else kube_fake.url
    if failure in ("timeout", "drop"):
        kube_fake.fail_reads("hang" if failure == "timeout" else "drop")
    elif failure.isdigit():
        kube_fake.fail_reads(int(failure))
    began = time.monotonic()
    assert KubernetesReconciler(url, timeout=0.5)(facts(action, arguments)) == "unknown"
    assert time.monotonic() - began < 3


class Recording(httpx.HTTPTransport):
    """The real transport, remembering the Authorization header of each request."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.seen: list[str | None] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request.headers.get("authorization"))
        return super().handle_request(request)


@pytest.mark.parametrize(
    ("credentials", "token", "file_text", "sent"),
    [
        pytest.param({"authorization": "Bearer agent"}, None, "sa", "Bearer agent", id="request"),
        pytest.param({}, None, "sa-token\n", "Bearer sa-token", id="token-file"),
        pytest.param({}, "explicit", "sa", "Bearer explicit", id="explicit-token"),
        pytest.param({}, None, None, None, id="none"),
    ],
)
def test_bearer_token(
    kube_fake: FakeKubernetes,
    tmp_path: Path,
    credentials: dict[str, str],
    token: str | None,
    file_text: str | None,
    sent: str | None,
) -> None:
    kube_fake.add_deployment("default", "web", 3)
    token_file = tmp_path / "token"
    if file_text is not None:
        token_file.write_text(file_text)
    transport = Recording()
    reconciler = KubernetesReconciler(
        kube_fake.url, token=token, token_file=str(token_file), transport=transport
    )
    args = {"deployment": "web", "replicas": 3}
    assert reconciler(facts("k8s.scale", args, credentials=credentials)) == "committed"
    assert transport.seen == [sent]
    assert "explicit" not in repr(reconciler)
    assert repr(reconciler) == f"KubernetesReconciler({kube_fake.url!r})"


def test_for_target_reads_the_token_file_at_call_time_and_verifies_tls(tmp_path: Path) -> None:
    with FakeKubernetes(tls=True) as fake:
        fake.add_deployment("default", "web", 4)
        token_file = tmp_path / "token"
        target = KubernetesTarget(fake.url, token_file=str(token_file), ca_file=str(fake.ca_file))
        reconciler = KubernetesReconciler.for_target(target)
        token_file.write_text("written-after-start")
        args = {"cluster": "prod-eu", "deployment": "web", "replicas": 4}
        assert reconciler(facts("k8s.scale", args, credentials={})) == "committed"
        untrusted = KubernetesReconciler(fake.url)
        assert untrusted(facts("k8s.scale", args)) == "unknown"


def test_settle_window() -> None:
    """A scale still in flight when its deadline fired is not yet "not executed": until the
    write's deadline plus the margin have passed on the ledger's clock, the answer is unknown."""
    with FakeKubernetes() as fake:
        fake.add_deployment("default", "web", 3)
        target = KubernetesTarget(fake.url, timeout=10.0)
        reconciler = KubernetesReconciler.for_target(target)
        args = {"namespace": "default", "deployment": "web", "replicas": 6}
        started = datetime.now(UTC)
        at = [started]
        asked = facts("k8s.scale", args, attempt_started_at=started, clock=lambda: at[0])
        assert reconciler(asked) == "unknown"
        at[0] = started + timedelta(seconds=10 + SETTLE_MARGIN - 1)
        assert reconciler(asked) == "unknown"
        at[0] = started + timedelta(seconds=10 + SETTLE_MARGIN)
        assert reconciler(asked) == "not_executed"
        # Recorded ambiguous late (its lease ran out): a forwarded write has its deadline, so
        # the window still runs from its start; a write with none (the SDK's) from the end.
        ended = replace(asked, ended_at=started + timedelta(seconds=120))
        assert reconciler(ended) == "not_executed"
        sdk = KubernetesReconciler(fake.url, settle_margin=SETTLE_MARGIN)
        assert sdk(ended) == "unknown"
