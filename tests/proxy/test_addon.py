"""The mitmproxy addon, every hook path, driven as mitmproxy tests its own addons: flows from
``mitmproxy.test.tflow`` through ``taddons``, over the real guard on a real SQLite ledger and,
where a write is forwarded, a real loopback Kubernetes."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from mitmproxy import http
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import taddons, tflow, tutils

from ctrlrun import ledger
from ctrlrun.control import Control
from ctrlrun.errors import StoreError
from ctrlrun.proxy import guard as guard_module
from ctrlrun.proxy.addon import METADATA, CtrlrunAddon
from ctrlrun.proxy.config import AgentCredential, Upstream
from ctrlrun.proxy.config_parse import policy_from_yaml, proxy_config
from ctrlrun.proxy.forward import Forwarded, Forwarder
from ctrlrun.proxy.gate import Gate
from ctrlrun.proxy.guard import Guard
from ctrlrun.proxy.principal import Principals
from ctrlrun.proxy.recognize import Recognizer
from ctrlrun.store import SQLiteStateStore
from ctrlrun.testing import FakeKubernetes

SCALE = "/apis/apps/v1/namespaces/default/deployments/checkout/scale"
DEPLOYMENT = "/apis/apps/v1/namespaces/default/deployments/checkout"
KEY = "scale:prod-eu:checkout:6"
BODY = b'{"spec":{"replicas":6}}'
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  k8s.scale:
    effect: "scale:{{cluster}}:{{deployment}}:{{replicas}}"
    decision: allow
upstreams:
  cluster:
    profile: kubernetes
    url: {url}
    cluster: prod-eu
    reconcile: "off"
"""


class Rig:
    """One addon over a real guard, ledger and loopback cluster."""

    def __init__(self, tmp_path: Path, kube: FakeKubernetes, principals: Principals) -> None:
        self.kube = kube
        self.policy = policy_from_yaml(POLICY.format(url=kube.url))
        self.control = Control(self.policy, SQLiteStateStore(tmp_path / "state.db"))
        self.forwarder = Forwarder(self.upstreams)
        self.make_control: Callable[[], Control] = lambda: self.control
        self.guard = Guard(lambda: self.make_control(), self.forwarder, {"cluster": None})
        self.reverse = f"reverse:{kube.url}@127.0.0.1:8101"
        config = proxy_config(self.policy)
        gate = Gate(Recognizer(self.upstreams), lambda: self.make_control(), lambda: config.egress)
        self.addon = CtrlrunAddon(
            self.guard, gate, self.upstreams, principals, {self.reverse: "cluster"}
        )

    @property
    def upstreams(self) -> Sequence[Upstream]:
        return proxy_config(self.policy).upstreams

    def flow(
        self,
        method: str = "PATCH",
        path: str = SCALE,
        *,
        host: str = "127.0.0.1",
        body: bytes | None = None,
        headers: Sequence[tuple[bytes, bytes]] = (),
        **kwargs: Any,
    ) -> http.HTTPFlow:
        content = (BODY if method != "GET" else b"") if body is None else body
        request = tutils.treq(
            host=host,
            port=self.kube.port,
            method=method.encode(),
            path=path.encode(),
            headers=http.Headers(((b"content-type", b"application/merge-patch+json"), *headers)),
            content=content,
        )
        flow = tflow.tflow(req=request, **kwargs)
        flow.client_conn.sni = None  # tflow's "address" would name another server
        return flow

    def cycle(self, flow: http.HTTPFlow) -> http.HTTPFlow:
        """One flow through the addon's hooks, as mitmproxy would run them."""

        async def run() -> None:
            with taddons.context(self.addon) as tctx:
                await tctx.cycle(self.addon, flow)

        asyncio.run(run())
        return flow

    def state(self, key: str = KEY) -> str | None:
        with self.control.store.reading() as conn:
            record = ledger.get_effect(conn, key)
        return None if record is None else record.state.value

    def close(self) -> None:
        asyncio.run(self.forwarder.aclose())
        self.control.store.close()


@pytest.fixture
def kube() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as fake:
        fake.add_deployment(namespace="default", name="checkout", replicas=3)
        yield fake


@pytest.fixture
def rig(tmp_path: Path, kube: FakeKubernetes) -> Iterator[Rig]:
    r = Rig(tmp_path, kube, Principals("unit-agent", ()))
    yield r
    r.close()


def body_of(flow: http.HTTPFlow) -> dict[str, Any]:
    assert flow.response is not None, "the flow would have been forwarded by mitmproxy"
    doc: dict[str, Any] = json.loads(flow.response.get_content() or b"{}")
    return doc


def _raise(exc: BaseException) -> Any:
    raise exc


# -- a write: forwarded, refused, decided -------------------------------------------------


def test_a_write_is_forwarded_by_the_guard_and_its_decision_kept(rig: Rig) -> None:
    flow = rig.cycle(rig.flow())

    assert flow.response is not None and flow.response.status_code == 200
    assert body_of(flow)["spec"]["replicas"] == 6  # the remote's own answer
    assert rig.kube.replicas("default", "checkout") == 6
    assert rig.state() == "committed"
    decision = flow.metadata[METADATA]
    assert decision["receipt_id"].startswith("ctr_")
    assert {k: v for k, v in decision.items() if k != "receipt_id"} == {
        "upstream": "cluster",
        "outcome": "committed",
        "reason": None,
        "action": "k8s.scale",
        "effect_key": KEY,
    }


def test_a_duplicate_is_refused_in_the_remotes_shape_and_never_forwarded(rig: Rig) -> None:
    rig.cycle(rig.flow())
    patches = rig.kube.count("PATCH")

    flow = rig.cycle(rig.flow())

    assert flow.response is not None and flow.response.status_code == 403
    assert flow.response.headers["X-Ctrlrun-Outcome"] == "duplicate"
    assert body_of(flow)["kind"] == "Status"
    assert rig.kube.count("PATCH") == patches
    decision = flow.metadata[METADATA]
    assert (decision["outcome"], decision["reason"], decision["effect_key"]) == (
        "duplicate",
        "committed",
        KEY,
    )
    assert body_of(flow)["ctrlrun"]["receipt_id"] == decision["receipt_id"]


def test_a_write_no_policy_could_allow_is_refused_before_the_ledger(rig: Rig) -> None:
    rig.make_control = lambda: _raise(RuntimeError("never asked"))

    flow = rig.cycle(rig.flow(body=b'{"spec":{"replicas":6.5}}'))

    assert flow.response is not None and flow.response.status_code == 422
    assert flow.metadata[METADATA]["outcome"] == "invalid_request"
    assert rig.kube.count("PATCH") == 0


def test_a_flow_through_a_reverse_listener_is_guarded_whatever_its_host(rig: Rig) -> None:
    flow = rig.flow(host="example.invalid")
    flow.client_conn.proxy_mode = ProxyMode.parse(rig.reverse)

    rig.cycle(flow)

    assert flow.metadata[METADATA]["outcome"] == "committed"
    assert rig.kube.replicas("default", "checkout") == 6


# -- flows the addon leaves alone ------------------------------------------------------------


@pytest.mark.parametrize("ended", ["resp", "err", "not_live"])
def test_a_flow_already_answered_or_ended_is_left_alone(rig: Rig, ended: str) -> None:
    flow = rig.flow(resp=ended == "resp", err=ended == "err", live=ended != "not_live")
    before = flow.response

    asyncio.run(rig.addon.request(flow))

    assert flow.response is before
    assert METADATA not in flow.metadata
    assert rig.kube.requests == [] and rig.state() is None


def test_a_flow_to_no_upstream_is_not_touched(rig: Rig) -> None:
    flow = rig.cycle(rig.flow(host="192.0.2.1"))  # a literal: nothing to resolve
    assert flow.response is None and METADATA not in flow.metadata
    assert rig.state() is None


def test_reads_pass_through_even_when_the_control_is_broken(rig: Rig) -> None:
    rig.make_control = lambda: _raise(RuntimeError("no control"))

    flow = rig.cycle(rig.flow("GET", DEPLOYMENT))

    assert flow.response is None  # left to mitmproxy, which forwards it untouched
    assert flow.metadata[METADATA] == {
        "upstream": "cluster",
        "outcome": "pass_through",
        "reason": "read",
    }
    assert rig.kube.requests == []


def test_a_write_the_routes_pass_through_says_why(rig: Rig) -> None:
    flow = rig.cycle(rig.flow(path=SCALE + "?dryRun=All"))

    assert flow.response is None
    decision = flow.metadata[METADATA]
    assert decision["outcome"] == "pass_through" and "dry run" in decision["reason"]
    assert rig.state() is None


# -- fail closed ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("control_factory_raises", "internal_error"),
        ("begin_raises_a_bug", "internal_error"),
        ("ledger_unavailable", "store_unavailable"),
        ("route_mapping_raises", "internal_error"),
        ("guard_raises", "internal_error"),
    ],
)
def test_an_error_before_forwarding_refuses_and_never_forwards(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, how: str, reason: str
) -> None:
    if how == "control_factory_raises":
        rig.make_control = lambda: _raise(RuntimeError("no control"))
    elif how == "begin_raises_a_bug":
        monkeypatch.setattr(rig.control, "begin_once", lambda *a, **k: _raise(KeyError("bug")))
    elif how == "ledger_unavailable":
        monkeypatch.setattr(rig.control, "begin_once", lambda *a, **k: _raise(StoreError("down")))
    elif how == "route_mapping_raises":
        monkeypatch.setattr(guard_module, "map_request", lambda *a: _raise(ValueError("bug")))
    else:
        monkeypatch.setattr(rig.guard, "handle", lambda *a, **k: _raise(TypeError("bug")))

    flow = rig.cycle(rig.flow())

    assert flow.response is not None and flow.response.status_code == 503
    assert flow.response.headers["X-Ctrlrun-Outcome"] == "unavailable"
    doc = body_of(flow)
    assert doc["kind"] == "Status" and doc["message"].startswith("ctrlrun:")
    assert doc["ctrlrun"]["reason"] == reason
    assert flow.metadata[METADATA]["outcome"] == "unavailable"
    assert flow.metadata[METADATA]["reason"] == reason
    assert rig.kube.requests == [] and rig.state() is None


class Raising:
    """A forwarder with a bug: it raises once it may have sent the write (a dry run, which
    persists nothing, goes through ``real``)."""

    def __init__(self, real: Any) -> None:
        self.calls = 0
        self.real = real

    async def send(self, *args: Any) -> Forwarded:
        if "dryRun=All" in args[2]:
            reply: Forwarded = await self.real.send(*args)
            return reply
        self.calls += 1
        raise RuntimeError("client bug")


def test_a_forwarder_that_raises_is_ambiguous_not_unavailable(rig: Rig) -> None:
    raising = Raising(rig.guard.forwarder)
    rig.guard.forwarder = raising  # type: ignore[assignment]

    flow = rig.cycle(rig.flow())

    # Not "nothing was forwarded": it may have left, so the agent is told not to retry blindly.
    assert flow.response is not None and flow.response.status_code == 504
    assert flow.response.headers["X-Ctrlrun-Outcome"] == "upstream_ambiguous"
    assert raising.calls == 1
    assert rig.state() == "ambiguous"
    assert flow.metadata[METADATA]["outcome"] == "upstream_ambiguous"


# -- who is asking: the CONNECT's credential ----------------------------------------------


def test_the_connect_credential_names_the_principal_until_the_client_leaves(
    tmp_path: Path, kube: FakeKubernetes
) -> None:
    principals = Principals(None, (AgentCredential("scaler", "TOKEN"),), {"TOKEN": "s3cret"})
    rig = Rig(tmp_path, kube, principals)
    credential = base64.b64encode(b"scaler:s3cret").decode()
    try:
        connect = rig.flow(
            "CONNECT", "", headers=((b"proxy-authorization", f"Basic {credential}".encode()),)
        )
        asyncio.run(rig.addon.http_connect(connect))
        inside = rig.flow()
        inside.client_conn = connect.client_conn  # a request inside that tunnel

        rig.cycle(inside)

        assert inside.metadata[METADATA]["outcome"] == "committed"
        with rig.control.store.reading() as conn:
            record = ledger.get_effect(conn, KEY)
        assert record is not None

        rig.addon.client_disconnected(connect.client_conn)
        again = rig.flow(body=b'{"spec":{"replicas":7}}')
        again.client_conn = connect.client_conn

        rig.cycle(again)

        assert again.metadata[METADATA]["reason"] == "no_principal"
        assert rig.addon.auth == {}
    finally:
        rig.close()


def test_a_wrong_proxy_credential_is_nobody(tmp_path: Path, kube: FakeKubernetes) -> None:
    principals = Principals(None, (AgentCredential("scaler", "TOKEN"),), {"TOKEN": "s3cret"})
    rig = Rig(tmp_path, kube, principals)
    wrong = base64.b64encode(b"scaler:guess").decode()
    try:
        flow = rig.cycle(rig.flow(headers=((b"proxy-authorization", f"Basic {wrong}".encode()),)))
        assert flow.response is not None and flow.response.status_code == 403
        assert flow.metadata[METADATA]["reason"] == "no_principal"
        assert kube.requests == []
    finally:
        rig.close()
