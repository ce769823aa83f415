"""Egress, the agent's proxy credential and refusal receipts, through the real proxy.

A recording upstream (not a configured upstream: a site the agent also uses) keeps every
request's headers. With ``egress: {default: deny}`` an unlisted host is refused, by CONNECT
or by plain request, with one line naming it and a receipt; a listed one passes.
``Proxy-Authorization`` never reaches a remote. With ``agents:`` listed, a write without a
valid token is refused even though the sidecar also runs with ``--principal``. Every refusal
kind leaves a receipt with the method, upstream and path, never the body.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Sidecar, fake_remotes, free_port, running_sidecar
from rawproxy import Recorder, connect, plain

from ctrlrun.testing import FakeKubernetes

pytestmark = pytest.mark.timeout(120)

TOKEN = "egress-bot-s3cret"
CREDENTIAL = "Basic " + base64.b64encode(f"bot:{TOKEN}".encode()).decode()
SCALE = "/apis/apps/v1/namespaces/default/deployments/checkout/scale"
MERGE = {"Content-Type": "application/merge-patch+json"}
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  k8s.scale:
    effect: "scale:{{cluster}}:{{deployment}}:{{replicas}}"
    decision: allow
upstreams:
  cluster:
    profile: kubernetes
    url: {kube}
    cluster: prod-eu
    reconcile: "off"
agents:
  bot: {{token_env: EGRESS_BOT_TOKEN}}
egress:
  default: deny
  allow: [localhost]
"""


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[Sidecar, FakeKubernetes, Recorder]]:
    env = {"EGRESS_BOT_TOKEN": TOKEN}
    with (
        fake_remotes("checkout") as (stripe, kube),
        Recorder() as site,
        running_sidecar(tmp_path, stripe, kube, policy_text=POLICY, in_process=True, env=env) as sc,
    ):
        yield sc, kube, site


def receipts(sc: Sidecar) -> list[dict[str, object]]:
    return [r.to_dict() for r in sc.receipts()]


def test_egress_deny_refuses_unlisted_hosts_with_a_receipt_and_passes_listed_ones(
    rig: tuple[Sidecar, FakeKubernetes, Recorder],
) -> None:
    sc, _, site = rig
    proxy, r = sc.proxy_port, site.port
    auth = {"Proxy-Authorization": CREDENTIAL}

    listed = plain(proxy, "GET", f"http://localhost:{r}/ok", f"localhost:{r}", headers=auth)
    assert listed.status == 200
    tunnelled = connect(proxy, f"localhost:{r}", "GET", "/tunnel", f"localhost:{r}")
    assert tunnelled.status == 200

    unlisted = plain(proxy, "GET", f"http://127.0.0.1:{r}/no", f"127.0.0.1:{r}", headers=auth)
    assert (unlisted.status, unlisted.outcome) == (403, "denied")
    line = json.loads(unlisted.body)["ctrlrun"]["reason"]
    assert line == "egress_denied" and f"127.0.0.1:{r}" in unlisted.body.decode()
    refused = connect(proxy, f"127.0.0.1:{r}", "GET", "/no", f"127.0.0.1:{r}")
    assert refused.status == 403

    assert [path for _, path, _ in site.seen] == ["/ok", "/tunnel"]
    got = [(x["action"], x["result"], x["arguments"]) for x in receipts(sc)]
    assert got == [
        (
            "proxy.egress_denied",
            "denied",
            {"method": "GET", "upstream": "-", "path": "/no", "host": f"127.0.0.1:{r}"},
        ),
        (
            "proxy.egress_denied",
            "denied",
            {"method": "CONNECT", "upstream": "-", "path": "", "host": f"127.0.0.1:{r}"},
        ),
    ]


def test_no_proxy_authorization_reaches_any_remote(
    rig: tuple[Sidecar, FakeKubernetes, Recorder],
) -> None:
    sc, _, site = rig
    proxy, r = sc.proxy_port, site.port
    auth = {"Proxy-Authorization": CREDENTIAL}
    assert (
        plain(proxy, "GET", f"http://localhost:{r}/a", f"localhost:{r}", headers=auth).status == 200
    )
    assert (
        plain(proxy, "POST", f"http://localhost:{r}/b", f"localhost:{r}", headers=auth).status
        == 200
    )
    assert site.seen and all("proxy-authorization" not in h for _, _, h in site.seen)


def test_every_refusal_kind_leaves_a_receipt_without_the_body(
    rig: tuple[Sidecar, FakeKubernetes, Recorder],
) -> None:
    sc, kube, _ = rig
    proxy, k = sc.proxy_port, kube.port
    target = f"http://127.0.0.1:{k}"

    def write(method: str, path: str, body: bytes, token: bool = True) -> int:
        headers = {**MERGE, **({"Proxy-Authorization": CREDENTIAL} if token else {})}
        got = plain(proxy, method, target + path, f"127.0.0.1:{k}", body=body, headers=headers)
        return got.status

    assert write("PATCH", SCALE, b'{"spec":{"replicas":5}}') == 200
    # --principal is set too: without the listed token the write has no principal.
    assert write("PATCH", SCALE, b'{"spec":{"replicas":6}}', token=False) == 403
    assert write("POST", "/api/v1/namespaces/default/pods", b'{"secret":"hunter2"}') == 403
    assert write("PATCH", SCALE, b'{"spec":{"replicas":6.5},"note":"hunter2"}') == 422

    assert kube.count("PATCH") == 1 and kube.count("POST") == 0
    got = receipts(sc)
    reasons = [(x["action"], x["result"], x["decision_reason"]) for x in got[1:]]
    assert got[0]["result"] == "committed"
    assert reasons == [
        # A workload write is named by what the apiserver would store, which is asked only
        # for a principal: refused before that, it is recorded as the upstream's write.
        ("cluster.unmapped_write", "denied", "no_principal"),
        ("cluster.unmapped_write", "denied", "unmapped_write"),
        ("cluster.invalid", "denied", "invalid_request"),
    ]
    for receipt in got[1:]:
        assert receipt["arguments"]["upstream"] == "cluster"  # type: ignore[index]
        assert "hunter2" not in json.dumps(receipt)


GUARDED_SITE = """\
schema: ctrlrun.policy/v2
actions: {{}}
upstreams:
  site:
    profile: http
    url: http://127.0.0.1:SITE
    listen: 127.0.0.1:LISTEN
    unmapped_writes: allow
"""


def test_no_proxy_authorization_reaches_a_guarded_upstream_either(tmp_path: Path) -> None:
    with fake_remotes() as (stripe, kube), Recorder() as site:
        listen = free_port()
        text = GUARDED_SITE.replace("SITE", str(site.port)).replace("LISTEN", str(listen))
        with running_sidecar(tmp_path, stripe, kube, policy_text=text, in_process=True) as sc:
            proxy, r = sc.proxy_port, site.port
            auth = {"Proxy-Authorization": CREDENTIAL}
            url = f"http://127.0.0.1:{r}"
            # Through the explicit proxy: a read (mitmproxy forwards it), a write (ctrlrun does).
            assert plain(proxy, "GET", url + "/r", f"127.0.0.1:{r}", headers=auth).status == 200
            assert plain(proxy, "POST", url + "/w", f"127.0.0.1:{r}", headers=auth).status == 200
            # Inside a tunnel to the upstream, and on its reverse listener.
            inside = connect(proxy, f"localhost:{r}", "POST", "/t", f"localhost:{r}", headers=auth)
            assert inside.status == 200
            direct = plain(listen, "POST", "/v", f"127.0.0.1:{listen}", headers=auth)
            assert direct.status == 200
    assert [path for _, path, _ in site.seen] == ["/r", "/w", "/t", "/v"]
    assert all("proxy-authorization" not in headers for _, _, headers in site.seen)
