"""Whatever an agent calls the upstream, a write reaches it only through the guard.

Each spelling of the fake cluster's address (case, trailing dot, ``localhost``, ``127.1``,
integer, hex and octal IPv4, IPv4-mapped IPv6, ``[::1]``, ``0.0.0.0``) is sent through the
real proxy as plain HTTP and inside a CONNECT tunnel, once with an allowed scale and once
with a denied one. The remote's count of writes must equal the ledger's count of forwarded
writes, and no denied replica count may reach it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Sidecar, fake_remotes, running_sidecar
from rawproxy import Reply, client_tls, connect, plain

from ctrlrun.testing import FakeKubernetes, FakeStripe

SCALE = "/apis/apps/v1/namespaces/default/deployments/checkout/scale"
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  k8s.scale:
    effect: "scale:{{cluster}}:{{deployment}}:{{replicas}}"
    rules:
      - when: {{replicas_lte: 50}}
        decision: allow
      - decision: deny
upstreams:
  cluster:
    profile: kubernetes
    url: {kube}
    cluster: prod-eu
    reconcile: "off"
"""
SPELLINGS = [
    "127.0.0.1",
    "localhost",
    "LOCALHOST.",
    "LocalHost",
    "127.1",
    "127.0.1",
    "2130706433",
    "0x7f000001",
    "0x7f.0.0.1",
    "0177.0.0.1",
    "017700000001",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[::1]",
    "0.0.0.0",
    "127.0.0.2",
]
HEADERS = {"Content-Type": "application/merge-patch+json"}


def scale(replicas: int) -> bytes:
    return json.dumps({"spec": {"replicas": replicas}}).encode()


def receipts(sc: Sidecar) -> list[dict[str, object]]:
    return [r.to_dict() for r in sc.receipts()]


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[tuple[Sidecar, FakeKubernetes]]:
    with (
        fake_remotes("checkout") as (stripe, kube),
        running_sidecar(tmp_path, stripe, kube, policy_text=POLICY, in_process=True) as sc,
    ):
        yield sc, kube


def send(sc: Sidecar, kube: FakeKubernetes, how: str, host: str, replicas: int) -> Reply:
    authority = f"{host}:{kube.port}"
    if how == "plain":
        return plain(
            sc.proxy_port,
            "PATCH",
            f"http://{authority}{SCALE}",
            authority,
            body=scale(replicas),
            headers=HEADERS,
        )
    return connect(
        sc.proxy_port, authority, "PATCH", SCALE, authority, body=scale(replicas), headers=HEADERS
    )


@pytest.mark.timeout(300)
def test_every_spelling_of_the_upstream_reaches_it_only_through_the_guard(
    guarded: tuple[Sidecar, FakeKubernetes],
) -> None:
    sc, kube = guarded
    allowed = 0
    for i, (how, host) in enumerate((h, s) for h in ("plain", "connect") for s in SPELLINGS):
        ok = send(sc, kube, how, host, replicas=i + 1)
        assert ok.status == 200, (how, host, ok)
        allowed += 1
        denied = send(sc, kube, how, host, replicas=60 + i)
        assert (denied.status, denied.outcome) == (403, "denied"), (how, host, denied)
        assert kube.replicas("default", "checkout") == i + 1, (how, host)

    forwarded = [r for r in receipts(sc) if r["result"] == "committed"]
    refused = [r for r in receipts(sc) if r["result"] == "denied"]
    assert kube.count("PATCH") == len(forwarded) == allowed
    assert len(refused) == allowed  # every denied spelling has its receipt


@pytest.fixture
def guarded_tls(tmp_path: Path) -> Iterator[tuple[Sidecar, FakeKubernetes]]:
    with FakeStripe() as stripe, FakeKubernetes(tls=True) as kube:
        kube.add_deployment(namespace="default", name="checkout", replicas=3)
        text = POLICY.replace("url: {kube}", "url: https://localhost:{kube_port}").replace(
            "    cluster: prod-eu\n", f"    cluster: prod-eu\n    ca_file: {kube.ca_file}\n"
        )
        text = text.replace("{kube_port}", str(kube.port))
        with running_sidecar(tmp_path, stripe, kube, policy_text=text, in_process=True) as sc:
            yield sc, kube


@pytest.mark.timeout(300)
def test_tls_to_the_upstream_address_is_intercepted_and_mismatches_are_refused(
    guarded_tls: tuple[Sidecar, FakeKubernetes],
) -> None:
    sc, kube = guarded_tls
    tls = client_tls(str(sc.workdir / "mitm" / "mitmproxy-ca-cert.pem"))
    p = kube.port

    def via(authority: str, sni: str | None, host: str, replicas: int) -> Reply:
        return connect(
            sc.proxy_port,
            authority,
            "PATCH",
            SCALE,
            host,
            tls=tls,
            sni=sni,
            body=scale(replicas),
            headers=HEADERS,
        )

    # The IP with no SNI (what in-cluster clients send), another spelling with the name's SNI.
    assert via(f"127.0.0.1:{p}", None, f"127.0.0.1:{p}", 7).status == 200
    assert via(f"127.1:{p}", "localhost", f"localhost:{p}", 8).status == 200
    assert via(f"[::1]:{p}", None, f"[::1]:{p}", 9).status == 200
    denied = via(f"0x7f000001:{p}", "localhost", f"localhost:{p}", 70)
    assert (denied.status, denied.outcome) == (403, "denied")
    # The guarded address, with an SNI or a Host naming another server: refused.
    sni = via(f"127.0.0.1:{p}", "192.0.2.1.", f"localhost:{p}", 11)
    assert (sni.status, sni.outcome) == (403, "denied"), sni
    host = via(f"127.0.0.1:{p}", None, f"192.0.2.1:{p}", 12)
    assert (host.status, host.outcome) == (403, "denied"), host

    assert kube.count("PATCH") == 3
    results = [(r["action"], r["result"]) for r in receipts(sc)]
    assert results.count(("k8s.scale", "committed")) == 3
    assert results.count(("proxy.destination_mismatch", "denied")) == 2
    assert kube.replicas("default", "checkout") == 9
