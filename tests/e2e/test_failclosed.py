"""Fail closed: a protected write that meets a broken ledger or an internal error is refused,
never forwarded; reads keep flowing.

The end-to-end half runs ``ctrlrun proxy`` on a throwaway PostgreSQL database and then stops
that database from accepting connections (and ends the ones it has), so every store call
really fails. The unit half drives ``CtrlrunAddon.request`` with mitmproxy's ``taddons`` and
``tflow`` and breaks the guard's collaborators one at a time.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import KUBE_TOKEN, STRIPE_KEY, start_sidecar
from mitmproxy import http
from mitmproxy.test import taddons, tflow, tutils

from ctrlrun import ledger
from ctrlrun.control import Control
from ctrlrun.errors import StoreError
from ctrlrun.policy import Policy
from ctrlrun.proxy import guard as guard_module
from ctrlrun.proxy.addon import CtrlrunAddon
from ctrlrun.proxy.config import Upstream
from ctrlrun.proxy.config_parse import policy_from_yaml, proxy_config
from ctrlrun.proxy.forward import Reply
from ctrlrun.proxy.guard import Guard
from ctrlrun.proxy.principal import Principals
from ctrlrun.store import SQLiteStateStore
from ctrlrun.testing import FakeKubernetes, FakeStripe

pytestmark = pytest.mark.timeout(90)

PG_SERVER = "postgresql://postgres@127.0.0.1:5432"
DEPLOYMENT = "/apis/apps/v1/namespaces/default/deployments/checkout"
SCALE = DEPLOYMENT + "/scale"
KUBE_HEADERS = {
    "Content-Type": "application/merge-patch+json",
    "Authorization": f"Bearer {KUBE_TOKEN}",
}


# -- end to end: the ledger goes away under a running proxy ---------------------------------


class Database:
    """A throwaway PostgreSQL database that can be cut off and brought back."""

    def __init__(self, admin: Any, name: str) -> None:
        self.admin, self.name = admin, name
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"

    def cut(self) -> None:
        """No new connections, and the open ones are ended: every store call now fails."""
        self.admin.execute(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS false')
        self.admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (self.name,),
        )

    def restore(self) -> None:
        self.admin.execute(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true')


@pytest.fixture
def database() -> Iterator[Database]:
    psycopg = pytest.importorskip("psycopg")
    try:
        admin = psycopg.connect(f"{PG_SERVER}/test", autocommit=True, connect_timeout=3)
    except psycopg.Error as exc:
        pytest.skip(f"no PostgreSQL at {PG_SERVER}: {exc}")
    db = Database(admin, f"ctrlrun_e2e_{uuid.uuid4().hex[:12]}")
    admin.execute(f'CREATE DATABASE "{db.name}"')
    try:
        yield db
    finally:
        db.restore()
        admin.execute(f'DROP DATABASE IF EXISTS "{db.name}" WITH (FORCE)')
        admin.close()


def wait_status(url: str, status: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        got = httpx.get(url, timeout=10, trust_env=False).status_code
        if got == status:
            return
        time.sleep(0.1)
    raise AssertionError(f"{url}: {got}, expected {status}")


def test_store_down_refuses_writes_unforwarded_and_reads_still_pass(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes], database: Database
) -> None:
    stripe, kube = fakes
    pi = stripe.add_payment_intent(amount=5000)
    sc = start_sidecar(tmp_path, stripe, kube, admin=True, store_url=database.url)
    kube_client = httpx.Client(base_url=sc.kube_base, timeout=30, trust_env=False)
    try:
        with kube_client:
            first = kube_client.patch(
                SCALE, content=b'{"spec":{"replicas":6}}', headers=KUBE_HEADERS
            )
            assert first.status_code == 200, first.text
            wait_status(sc.admin_url + "/readyz", 200)

            database.cut()
            wait_status(sc.admin_url + "/readyz", 503)
            patches, posts = kube.count("PATCH"), stripe.count("POST")

            started = time.monotonic()
            refused = kube_client.patch(
                SCALE, content=b'{"spec":{"replicas":7}}', headers=KUBE_HEADERS
            )
            assert time.monotonic() - started < 15
            assert refused.status_code == 503
            assert refused.headers["X-Ctrlrun-Outcome"] == "unavailable"
            assert refused.json()["kind"] == "Status"
            assert refused.json()["message"].startswith("ctrlrun:")
            assert refused.json()["ctrlrun"]["reason"] == "store_unavailable"
            refund = httpx.post(
                sc.stripe_base + "/v1/refunds",
                data={"payment_intent": pi["id"], "amount": "1000"},
                headers={"Authorization": f"Bearer {STRIPE_KEY}"},
                timeout=30,
                trust_env=False,
            )
            assert refund.status_code == 503
            assert refund.headers["X-Ctrlrun-Outcome"] == "unavailable"
            assert refund.json()["error"]["code"] == "ctrlrun_unavailable"
            # Nothing reached either remote.
            assert (kube.count("PATCH"), stripe.count("POST")) == (patches, posts)
            assert kube.replicas("default", "checkout") == 6

            read = kube_client.get(DEPLOYMENT, headers={"Authorization": f"Bearer {KUBE_TOKEN}"})
            assert read.status_code == 200
            assert read.json()["spec"]["replicas"] == 6

            database.restore()
            wait_status(sc.admin_url + "/readyz", 200)
            again = kube_client.patch(
                SCALE, content=b'{"spec":{"replicas":7}}', headers=KUBE_HEADERS
            )
            assert again.status_code == 200, again.text
            assert kube.replicas("default", "checkout") == 7
    finally:
        sc.stop()
    effects = sc.cli("effects", "--json", "--store-url", database.url)
    states = {
        json.loads(line)["effect_key"]: json.loads(line)["state"]
        for line in effects.stdout.splitlines()
    }
    assert states == {
        "scale:prod-eu:checkout:6": "committed",
        "scale:prod-eu:checkout:7": "committed",
    }


# -- the addon hook: internal errors refuse, never forward -----------------------------------

UNIT_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  k8s.scale:
    effect: "scale:{cluster}:{deployment}:{replicas}"
    decision: allow
upstreams:
  cluster:
    profile: kubernetes
    url: http://kube.test:6443
    cluster: prod-eu
    reconcile: "off"
"""
KEY = "scale:prod-eu:checkout:6"


class RecordingForwarder:
    """Stands in for ``Forwarder``: records each call, answers 200 or raises."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.error = error

    async def send(
        self,
        upstream: Upstream,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
    ) -> Reply:
        self.calls.append((method, path))
        if self.error is not None:
            raise self.error
        return Reply(200, (("Content-Type", "application/json"),), b'{"spec":{"replicas":6}}')


@pytest.fixture
def control(tmp_path: Path) -> Iterator[Control]:
    store = SQLiteStateStore(tmp_path / "state.db")
    try:
        yield Control(Policy.from_yaml(UNIT_POLICY), store)
    finally:
        store.close()


def cycle(
    control: Callable[[], Control],
    forwarder: RecordingForwarder,
    method: str = "PATCH",
    path: str = SCALE,
) -> http.HTTPFlow:
    """One flow through the addon's hooks, as mitmproxy would run them."""
    upstreams = proxy_config(policy_from_yaml(UNIT_POLICY)).upstreams
    guard = Guard(control, forwarder, {"cluster": None})  # type: ignore[arg-type]
    addon = CtrlrunAddon(guard, upstreams, Principals("unit-agent", ()), {})
    body = b'{"spec":{"replicas":6}}' if method != "GET" else b""
    flow = tflow.tflow(
        req=tutils.treq(
            host="kube.test",
            port=6443,
            method=method.encode(),
            path=path.encode(),
            headers=http.Headers(((b"content-type", b"application/merge-patch+json"),)),
            content=body,
        )
    )

    async def run() -> None:
        with taddons.context(addon) as tctx:
            await tctx.cycle(addon, flow)

    asyncio.run(run())
    return flow


def assert_refused_unavailable(flow: http.HTTPFlow) -> dict[str, Any]:
    assert flow.response is not None, "the flow would have been forwarded"
    assert flow.response.status_code == 503
    assert flow.response.headers["X-Ctrlrun-Outcome"] == "unavailable"
    body: dict[str, Any] = json.loads(flow.response.get_content() or b"{}")
    assert body["kind"] == "Status"
    assert body["message"].startswith("ctrlrun:")
    return body


def effect_state(control: Control, key: str) -> str | None:
    with control.store.reading() as conn:
        record = ledger.get_effect(conn, key)
    return None if record is None else record.state.value


def test_a_healthy_guard_forwards_with_its_own_client(control: Control) -> None:
    forwarder = RecordingForwarder()
    flow = cycle(lambda: control, forwarder)
    assert flow.response is not None and flow.response.status_code == 200
    assert forwarder.calls == [("PATCH", SCALE)]
    assert effect_state(control, KEY) == "committed"


def _raise(exc: BaseException) -> Any:
    raise exc


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("control_factory_raises", "internal_error"),
        ("begin_raises_a_bug", "internal_error"),
        ("ledger_unavailable", "store_unavailable"),
        ("route_mapping_raises", "internal_error"),
    ],
)
def test_an_error_before_forwarding_refuses_and_never_forwards(
    control: Control, monkeypatch: pytest.MonkeyPatch, how: str, reason: str
) -> None:
    factory: Callable[[], Control] = lambda: control  # noqa: E731
    if how == "control_factory_raises":
        factory = lambda: _raise(RuntimeError("no control"))  # noqa: E731
    elif how == "begin_raises_a_bug":
        monkeypatch.setattr(control, "begin", lambda *a, **k: _raise(KeyError("bug")))
    elif how == "ledger_unavailable":
        monkeypatch.setattr(control, "begin", lambda *a, **k: _raise(StoreError("ledger down")))
    else:
        monkeypatch.setattr(guard_module, "map_request", lambda *a: _raise(ValueError("bug")))
    forwarder = RecordingForwarder()

    flow = cycle(factory, forwarder)

    body = assert_refused_unavailable(flow)
    assert body["ctrlrun"]["reason"] == reason
    assert forwarder.calls == []
    assert effect_state(control, KEY) is None


def test_a_forwarder_that_raises_refuses_and_records_ambiguous(control: Control) -> None:
    forwarder = RecordingForwarder(RuntimeError("client bug"))

    flow = cycle(lambda: control, forwarder)

    # Not "nothing was forwarded": it may have left, so the agent is told not to retry blindly.
    assert flow.response is not None and flow.response.status_code == 504
    assert flow.response.headers["X-Ctrlrun-Outcome"] == "upstream_ambiguous"
    assert forwarder.calls == [("PATCH", SCALE)]
    # It may have left: the record says nobody knows, and a retry is refused until reconciled.
    assert effect_state(control, KEY) == "ambiguous"


def test_reads_pass_even_when_the_control_is_broken() -> None:
    forwarder = RecordingForwarder()
    flow = cycle(lambda: _raise(RuntimeError("no control")), forwarder, "GET", DEPLOYMENT)
    assert flow.response is None  # left to mitmproxy, which forwards it untouched
    assert forwarder.calls == []
