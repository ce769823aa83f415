"""Every row of DESIGN.md's outcome classification, produced for real against the fakes.

One sidecar (``reconcile: off``, so the raw classification is what gets recorded) fronts a
fake Stripe, plus Kubernetes upstreams that cannot be reached in each way a connection can
fail before anything is sent: refused, a name that does not resolve, a TLS handshake that
fails (plain HTTP behind an https url; a TLS server whose CA is not trusted).

    nothing sent (DNS, refused, connect timeout, TLS handshake)   failed
    2xx                                                        committed
    4xx except 408, 424 (Stripe 402 included)                  failed
    408, 424, 5xx, timeout or reset after sending              ambiguous
"""

from __future__ import annotations

import contextlib
import signal
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
from e2e.harness import Sidecar, free_port, refusing_port, start_sidecar

from ctrlrun import ledger
from ctrlrun.store import open_store
from ctrlrun.testing import FakeKubernetes, FakeStripe

STRIPE_KEY = "sk_test_faults_0001"
SCALE = "/apis/apps/v1/namespaces/default/deployments/checkout/scale"
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{{payment_id}}"
    decision: allow
  k8s.scale:
    effect: "scale:{{cluster}}:{{deployment}}:{{replicas}}"
    decision: allow
  k8s.delete_deployment:
    effect: "delete:{{cluster}}:{{namespace}}:{{deployment}}"
    decision: allow
upstreams:
  stripe:
    profile: stripe
    url: {stripe}
    listen: 127.0.0.1:{stripe_port}
    timeout: {timeout}
    reconcile: {reconcile}
  cluster:
    profile: kubernetes
    url: {kube}
    listen: 127.0.0.1:{kube_port}
    timeout: {timeout}
    reconcile: {reconcile}
"""
UNREACHABLE = """\
  {name}:
    profile: kubernetes
    url: {url}
    listen: 127.0.0.1:{port}
    timeout: {{timeout}}
    reconcile: {{reconcile}}
"""


@dataclass
class Rig:
    sidecar: Sidecar
    stripe: FakeStripe
    kube: FakeKubernetes
    untrusted: FakeKubernetes
    listeners: dict[str, str]  # unreachable upstream name -> its reverse listener URL

    def state(self, key: str) -> str | None:
        store = open_store(self.sidecar.store_url, create=False)
        try:
            with store.reading() as conn:
                rec = ledger.get_effect(conn, key)
        finally:
            store.close()
        return None if rec is None else rec.state.value


def full_backlog() -> list[socket.socket]:
    """A loopback listener that never accepts, its queue full: new SYNs are dropped, so a
    connect times out (the listener comes first in the list)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    for _ in range(3):
        sock = socket.socket()
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.connect(listener.getsockname())
        fillers.append(sock)
    return [listener, *fillers]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with (
        FakeStripe(hang_seconds=4) as stripe,
        FakeKubernetes() as kube,
        FakeKubernetes(tls=True) as untrusted,
        refusing_port() as closed,  # bound, never listening: connection refused
    ):
        blackhole = full_backlog()
        upstreams = {
            "refused": f"http://127.0.0.1:{closed}",
            "connect_timeout": f"http://127.0.0.1:{blackhole[0].getsockname()[1]}",
            "tls_plain": f"https://127.0.0.1:{kube.port}",  # TLS to a plain HTTP server
            "tls_untrusted": untrusted.url,  # its CA is not given in ca_file
        }
        ports = {name: free_port() for name in upstreams}
        text = POLICY + "".join(
            UNREACHABLE.format(name=n, url=u, port=ports[n]) for n, u in upstreams.items()
        )
        sc = start_sidecar(
            tmp_path_factory.mktemp("faults"),
            stripe,
            kube,
            policy_text=text,
            timeout=1,
            reconcile="off",
        )
        try:
            yield Rig(
                sc, stripe, kube, untrusted, {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}
            )
        finally:
            sc.stop(signal.SIGKILL)
            for sock in blackhole:
                sock.close()


def refund(rig: Rig, arm: Callable[[FakeStripe], None] | None) -> tuple[httpx.Response, str]:
    pi = rig.stripe.add_payment_intent(amount=5000)
    if arm is not None:
        arm(rig.stripe)
    with httpx.Client(base_url=rig.sidecar.stripe_base, timeout=30, trust_env=False) as c:
        r = c.post(
            "/v1/refunds",
            data={"payment_intent": pi["id"], "amount": "100"},
            headers={"Authorization": f"Bearer {STRIPE_KEY}"},
        )
    return r, f"refund:{pi['id']}"


def arming(mode: str | int | None) -> Callable[[FakeStripe], None] | None:
    if mode is None:
        return None
    return lambda fake: fake.fail_next(mode)


# (row, how the fake answers, the record, what the agent sees)
REMOTE_ROWS = [
    ("2xx", None, "committed", 200),
    ("400", 400, "failed", 400),
    ("402 card declined", 402, "failed", 402),
    ("404", 404, "failed", 404),
    ("408", 408, "ambiguous", 504),
    ("409 (another request with the key may still apply it)", 409, "ambiguous", 504),
    ("424", 424, "ambiguous", 504),
    ("429", 429, "failed", 429),
    ("500", 500, "ambiguous", 504),
    ("502", 502, "ambiguous", 504),
    ("503", 503, "ambiguous", 504),
    ("504", 504, "ambiguous", 504),
    ("commit then 500", "commit_then_500", "ambiguous", 504),
    ("reset before read", "reset_before", "ambiguous", 504),
    ("commit then reset", "commit_then_drop", "ambiguous", 504),
    ("hang past the deadline", "hang", "ambiguous", 504),
]


@pytest.mark.parametrize(
    ("row", "mode", "record", "status"), REMOTE_ROWS, ids=[r[0] for r in REMOTE_ROWS]
)
def test_remote_answers_are_classified(
    rig: Rig, row: str, mode: str | int | None, record: str, status: int
) -> None:
    before = rig.stripe.count("POST", "/v1/refunds")
    r, key = refund(rig, arming(mode))
    recorded = rig.state(key)
    print(
        f"{row}: record={recorded} agent={r.status_code} "
        f"outcome={r.headers.get('x-ctrlrun-outcome', '-')}"
    )
    assert rig.stripe.count("POST", "/v1/refunds") == before + 1  # forwarded exactly once
    assert recorded == record
    assert r.status_code == status
    if status == 504:
        assert r.headers["x-ctrlrun-outcome"] == "upstream_ambiguous"


TRANSPORT_ROWS = [
    ("connection refused", "refused"),
    ("connect timeout", "connect_timeout"),
    # A DNS failure would ask the machine's resolver, off loopback: it is proven on the
    # client with a refused lookup instead (tests/proxy/test_h1.py).
    ("TLS handshake failure (plain server)", "tls_plain"),
    ("TLS handshake failure (untrusted CA)", "tls_untrusted"),
]


@pytest.mark.parametrize(("row", "upstream"), TRANSPORT_ROWS, ids=[r[1] for r in TRANSPORT_ROWS])
def test_nothing_sent_is_failed(rig: Rig, row: str, upstream: str) -> None:
    # A delete is forwarded as it is (a scale is first asked of the apiserver: see below).
    received = rig.kube.count() + rig.untrusted.count()
    deployment = SCALE.removesuffix("/scale")
    with httpx.Client(base_url=rig.listeners[upstream], timeout=30, trust_env=False) as c:
        r = c.delete(deployment)
    key = f"delete:{upstream}:default:checkout"
    recorded = rig.state(key)
    print(
        f"{row}: record={recorded} agent={r.status_code} "
        f"outcome={r.headers.get('x-ctrlrun-outcome', '-')}"
    )
    assert recorded == "failed"
    assert r.status_code >= 500
    assert rig.kube.count() + rig.untrusted.count() == received  # no request was read
    # Failed means the next attempt may go: a renewal, attempt 2 (and it fails the same way).
    with httpx.Client(base_url=rig.listeners[upstream], timeout=30, trust_env=False) as c:
        again = c.delete(deployment)
    assert again.headers.get("x-ctrlrun-outcome") not in ("duplicate", "ambiguous", "in_progress")
    store = open_store(rig.sidecar.store_url, create=False)
    try:
        with store.reading() as conn:
            rec = ledger.get_effect(conn, key)
    finally:
        store.close()
    assert rec is not None and rec.attempt == 2 and rec.state.value == "failed"
    # A scale is decided on the apiserver's dry run: when that cannot be asked, the write
    # is refused before anything is reserved, and a retry is safe.
    with httpx.Client(base_url=rig.listeners[upstream], timeout=30, trust_env=False) as c:
        r = c.patch(
            SCALE,
            content=b'{"spec":{"replicas":4}}',
            headers={"Content-Type": "application/merge-patch+json"},
        )
    assert r.status_code == 503 and r.headers["x-ctrlrun-outcome"] == "unavailable"
    assert rig.state(f"scale:{upstream}:checkout:4") is None
