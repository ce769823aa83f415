"""Reconcilers asked by a remote that lies by accident: every such answer proves nothing.

The remote is a real HTTP/1.1 server on loopback that answers each GET with scripted bytes
(any status, any body, trickled, or cut by a reset), so what the reconciler reads is exactly
what a proxy, a gateway or a confused server would send.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
from sweep_support import POLICY, events_of, stuck

from ctrlrun import Control, Policy, SQLiteStateStore, ledger
from ctrlrun.action import utc_now
from ctrlrun.reconcilers import (
    Check,
    DeclarativeReconciler,
    EffectFacts,
    KubernetesReconciler,
    StripeReconciler,
)
from ctrlrun.reconcilers.sweep import sweep

HTML = b"<html><body><h1>Not Found</h1>nginx</body></html>"


@dataclass
class Script:
    """What the remote answers to one GET: a status, headers, a body (maybe trickled or cut)."""

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    trickle: float = 0.0  # seconds between single body bytes
    reset_after: int | None = None  # send that many body bytes, then reset the connection


def js(status: int, document: Any, **kw: Any) -> Script:
    return Script(status, json.dumps(document).encode(), **kw)


def html(status: int, **kw: Any) -> Script:
    return Script(status, HTML, content_type="text/html", **kw)


Answerer = Callable[[str], Script]


class LyingRemote:
    """A loopback HTTP/1.1 server answering each request with ``answer(target)``'s script."""

    def __init__(self, answer: Answerer) -> None:
        self.answer = answer
        self.targets: list[str] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def __enter__(self) -> LyingRemote:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            target = head.split(b"\r\n", 1)[0].split(b" ")[1].decode()
            self.targets.append(target)
            self._send(conn, self.answer(target))

    def _send(self, conn: socket.socket, script: Script) -> None:
        headers = {
            "Content-Type": script.content_type,
            "Content-Length": str(len(script.body)),
            "Date": format_datetime(datetime.now(UTC), usegmt=True),
            "Connection": "close",
            **script.headers,
        }
        lines = [f"HTTP/1.1 {script.status} X"] + [f"{k}: {v}" for k, v in headers.items()]
        try:
            conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            body = script.body
            if script.reset_after is not None:
                conn.sendall(body[: script.reset_after])
                time.sleep(0.05)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            if not script.trickle:
                conn.sendall(body)
                return
            for i in range(len(body)):
                if self._stop.is_set():
                    return
                conn.sendall(body[i : i + 1])
                time.sleep(script.trickle)
        except OSError:
            return


@pytest.fixture
def remote() -> Iterator[Callable[[Answerer], LyingRemote]]:
    started: list[LyingRemote] = []

    def start(answer: Answerer) -> LyingRemote:
        server = LyingRemote(answer).__enter__()
        started.append(server)
        return server

    yield start
    for server in started:
        server.__exit__(None, None, None)


def facts(action: str, arguments: dict[str, Any], **kw: Any) -> EffectFacts:
    # Asked ten minutes after the attempt began, on a ledger clock that agrees with the remote's.
    kw.setdefault("attempt_started_at", datetime.now(UTC) - timedelta(minutes=10))
    kw.setdefault("credentials", {"authorization": "Bearer t"})
    return EffectFacts(effect_key=f"{action}:k", action=action, arguments=arguments, **kw)


def always(script: Script) -> Answerer:
    return lambda target: script


# -- Stripe -----------------------------------------------------------------------------------


def stripe(url: str, **kw: Any) -> StripeReconciler:
    return StripeReconciler(url, api_key="sk_test_x", **kw)


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(js(200, {}), id="empty-object"),
        pytest.param(js(200, {"id": "cus_other", "object": "customer"}), id="another-customer"),
        pytest.param(js(200, {"error": {"type": "api_error"}}), id="an-error-in-a-200"),
        pytest.param(js(200, {"object": "list", "data": [], "has_more": False}), id="a-list"),
    ],
)
def test_a_customer_delete_is_not_disproved_by_another_object(
    remote: Callable[[Answerer], LyingRemote], reply: Script
) -> None:
    server = remote(always(reply))
    hook = stripe(server.url)
    assert hook(facts("stripe.delete_customer", {"customer": "cus_1"})) == "unknown"


def test_a_customer_that_is_there_is_not_deleted(
    remote: Callable[[Answerer], LyingRemote],
) -> None:
    server = remote(always(js(200, {"id": "cus_1", "object": "customer", "email": None})))
    hook = stripe(server.url)
    assert hook(facts("stripe.delete_customer", {"customer": "cus_1"})) == "not_executed"


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        pytest.param(
            js(200, {"id": "pi_other", "object": "payment_intent", "status": "succeeded"}),
            "unknown",
            id="another-payment-intent",
        ),
        pytest.param(
            js(200, {"id": "pi_other", "object": "payment_intent", "status": "canceled"}),
            "unknown",
            id="another-one-canceled",
        ),
        pytest.param(
            js(200, {"id": "pi_1", "object": "payment_intent", "status": "succeeded"}),
            "not_executed",
            id="this-one-succeeded",
        ),
        pytest.param(
            js(200, {"id": "pi_1", "object": "payment_intent", "status": "canceled"}),
            "committed",
            id="this-one-canceled",
        ),
    ],
)
def test_a_cancel_is_judged_on_that_payment_intent_only(
    remote: Callable[[Answerer], LyingRemote], reply: Script, expected: str
) -> None:
    server = remote(always(reply))
    hook = stripe(server.url)
    assert hook(facts("stripe.cancel_payment_intent", {"payment_intent": "pi_1"})) == expected


def refund_list(*refunds: dict[str, Any], more: bool = False) -> Script:
    return js(200, {"object": "list", "url": "/v1/refunds", "has_more": more, "data": refunds})


def a_refund(payment: str, amount: int = 500, **kw: Any) -> dict[str, Any]:
    return {
        "id": f"re_{payment}_{amount}",
        "object": "refund",
        "payment_intent": payment,
        "charge": f"ch_{payment}",
        "amount": amount,
        "created": int(time.time()),
        "status": "succeeded",
        **kw,
    }


def stripe_lists(refunds: Script) -> Answerer:
    empty_events = js(200, {"object": "list", "url": "/v1/events", "has_more": False, "data": []})
    return lambda target: refunds if target.startswith("/v1/refunds") else empty_events


def test_a_refund_of_another_payment_in_the_list_proves_nothing(
    remote: Callable[[Answerer], LyingRemote],
) -> None:
    """A list that ignored its filter (another payment's refund) is no list of this payment."""
    server = remote(stripe_lists(refund_list(a_refund("pi_other"))))
    args = {"payment_intent": "pi_1", "amount": 500}
    assert stripe(server.url)(facts("stripe.refund", args)) == "unknown"


@pytest.mark.parametrize("status", ["pending", "requires_action", "failed", "canceled"])
def test_a_refund_in_any_status_is_the_write_having_run(
    remote: Callable[[Answerer], LyingRemote], status: str
) -> None:
    """Stripe created the refund object: the POST ran (a 200 would have been committed)."""
    server = remote(stripe_lists(refund_list(a_refund("pi_1", status=status))))
    args = {"payment_intent": "pi_1", "amount": 500}
    assert stripe(server.url)(facts("stripe.refund", args)) == "committed"


@pytest.mark.parametrize(
    "reply",
    [
        *(pytest.param(html(s), id=f"html-{s}") for s in (401, 403, 404, 409, 429, 500, 502)),
        pytest.param(html(200), id="html-200"),
        pytest.param(Script(200, b""), id="empty-200"),
        pytest.param(
            Script(302, b"", headers={"Location": "http://example.invalid/v1/refunds"}),
            id="redirect-elsewhere",
        ),
        pytest.param(
            refund_list(a_refund("pi_1", amount=900), more=True), id="truncated-no-cursor-moves"
        ),
        pytest.param(
            Script(
                200,
                json.dumps({"object": "list", "has_more": False, "data": []}).encode(),
                reset_after=10,
            ),
            id="reset-mid-body",
        ),
    ],
)
def test_a_refund_list_that_is_no_answer_is_unknown(
    remote: Callable[[Answerer], LyingRemote], reply: Script
) -> None:
    server = remote(stripe_lists(reply))
    args = {"payment_intent": "pi_1", "amount": 500}
    assert stripe(server.url, max_pages=3)(facts("stripe.refund", args)) == "unknown"


def test_a_body_trickled_past_the_deadline_is_cut_at_the_deadline(
    remote: Callable[[Answerer], LyingRemote],
) -> None:
    """httpx's timeout is per read: a remote sending a byte every 0.2 s must not hold a
    reconciliation past its deadline (the sweep and the agent's answer wait on it)."""
    body = json.dumps({"object": "list", "has_more": False, "data": []}).encode()
    server = remote(stripe_lists(Script(200, body, trickle=0.2)))
    hook = stripe(server.url, timeout=1.0, deadline=1.5)
    began = time.monotonic()
    answer = hook(facts("stripe.refund", {"payment_intent": "pi_1", "amount": 500}))
    assert answer == "unknown"
    assert time.monotonic() - began < 3.0


# -- Kubernetes -------------------------------------------------------------------------------


def kube(url: str) -> KubernetesReconciler:
    return KubernetesReconciler(url, token="t")


def status_404(name: str, kind: str, group: str = "") -> Script:
    details = {"name": name, "kind": kind, **({"group": group} if group else {})}
    return js(
        404,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f'{kind} "{name}" not found',
            "reason": "NotFound",
            "details": details,
            "code": 404,
        },
    )


DEPLOY = {"namespace": "prod", "deployment": "web"}


@pytest.mark.parametrize(
    ("action", "arguments", "reply"),
    [
        pytest.param("k8s.delete_namespace", {"name": "shop"}, html(404), id="ns-html-404"),
        pytest.param("k8s.delete_namespace", {"name": "shop"}, js(404, {}), id="ns-empty-404"),
        pytest.param(
            "k8s.delete_namespace",
            {"name": "shop"},
            status_404("other", "namespaces"),
            id="ns-another-name",
        ),
        pytest.param("k8s.delete_deployment", DEPLOY, html(404), id="deploy-html-404"),
        pytest.param(
            "k8s.delete_deployment",
            DEPLOY,
            status_404("web", "namespaces"),
            id="deploy-404-names-the-namespace",
        ),
        pytest.param("k8s.scale", {**DEPLOY, "replicas": 5}, html(404), id="scale-html-404"),
        pytest.param(
            "k8s.scale",
            {**DEPLOY, "replicas": 5},
            js(404, {"kind": "Status", "reason": "NotFound", "details": {}}),
            id="scale-404-no-details",
        ),
    ],
)
def test_a_404_that_is_not_the_apiservers_word_about_the_object_is_unknown(
    remote: Callable[[Answerer], LyingRemote], action: str, arguments: dict[str, Any], reply: Script
) -> None:
    """An ingress, a gateway or a path the apiserver does not serve answers 404 too."""
    server = remote(always(reply))
    assert kube(server.url)(facts(action, {"cluster": "eu", **arguments})) == "unknown"


@pytest.mark.parametrize(
    ("action", "arguments", "reply", "expected"),
    [
        ("k8s.delete_namespace", {"name": "shop"}, status_404("shop", "namespaces"), "committed"),
        (
            "k8s.delete_deployment",
            DEPLOY,
            status_404("web", "deployments", "apps"),
            "committed",
        ),
        (
            "k8s.scale",
            {**DEPLOY, "replicas": 5},
            status_404("web", "deployments", "apps"),
            "not_executed",
        ),
    ],
)
def test_the_apiservers_own_404_still_counts(
    remote: Callable[[Answerer], LyingRemote],
    action: str,
    arguments: dict[str, Any],
    reply: Script,
    expected: str,
) -> None:
    server = remote(always(reply))
    assert kube(server.url)(facts(action, {"cluster": "eu", **arguments})) == expected


def k8s_object(name: str, namespace: str | None = None, **meta: Any) -> dict[str, Any]:
    metadata = {"name": name, "uid": "u-1", "resourceVersion": "7", **meta}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {"metadata": metadata, "spec": {"replicas": 3}}


@pytest.mark.parametrize(
    ("action", "arguments", "reply"),
    [
        pytest.param(
            "k8s.delete_namespace", {"name": "shop"}, js(200, k8s_object("other")), id="ns-other"
        ),
        pytest.param(
            "k8s.delete_deployment", DEPLOY, js(200, k8s_object("api", "prod")), id="deploy-other"
        ),
        pytest.param(
            "k8s.delete_deployment",
            DEPLOY,
            js(200, k8s_object("web", "staging")),
            id="deploy-other-namespace",
        ),
        pytest.param(
            "k8s.scale",
            {**DEPLOY, "replicas": 5},
            js(200, k8s_object("api", "prod")),
            id="scale-other",
        ),
    ],
)
def test_another_object_proves_nothing(
    remote: Callable[[Answerer], LyingRemote], action: str, arguments: dict[str, Any], reply: Script
) -> None:
    server = remote(always(reply))
    assert kube(server.url)(facts(action, {"cluster": "eu", **arguments})) == "unknown"


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def dated(script: Script, remote_now: datetime) -> Script:
    """The script answered by an apiserver whose clock reads ``remote_now``."""
    script.headers["Date"] = format_datetime(remote_now, usegmt=True)
    return script


@pytest.mark.parametrize(
    ("created_ago", "expected"),
    [
        pytest.param(timedelta(minutes=5), "unknown", id="created-since-the-attempt"),
        pytest.param(timedelta(hours=1), "not_executed", id="older-than-the-attempt"),
    ],
)
def test_an_object_created_since_the_attempt_began_is_not_the_one_it_deleted(
    remote: Callable[[Answerer], LyingRemote], created_ago: timedelta, expected: str
) -> None:
    """Deleted by the attempt (ten minutes ago), then created again by someone else: there,
    but the delete ran, and a retry would delete the new one."""
    created = stamp(datetime.now(UTC) - created_ago)
    server = remote(always(js(200, k8s_object("shop", creationTimestamp=created))))
    assert kube(server.url)(facts("k8s.delete_namespace", {"name": "shop"})) == expected


def scale_object(replicas: int) -> dict[str, Any]:
    return {**k8s_object("web", "prod"), "kind": "Scale", "spec": {"replicas": replicas}}


def written(*entries: tuple[str, datetime, str | None]) -> dict[str, Any]:
    fields = [
        {
            "manager": m,
            "operation": "Update",
            "time": stamp(t),
            **({"subresource": sub} if sub else {}),
        }
        for m, t, sub in entries
    ]
    deployment = k8s_object("web", "prod", managedFields=fields)
    deployment["metadata"]["creationTimestamp"] = stamp(datetime.now(UTC) - timedelta(days=1))
    return deployment


def apiserver(deployment: dict[str, Any], replicas: int, offset: timedelta) -> Answerer:
    """``/scale`` shows ``replicas``; the deployment itself ``deployment``; clock off by
    ``offset`` (its Date and its managedFields times alike)."""

    def answer(target: str) -> Script:
        now = datetime.now(UTC) + offset
        document = scale_object(replicas) if target.endswith("/scale") else deployment
        return dated(js(200, document), now)

    return answer


HOUR = timedelta(hours=1)


@pytest.mark.parametrize(
    ("entries", "offset", "expected"),
    [
        pytest.param([("hpa", timedelta(minutes=-2), None)], timedelta(0), "unknown", id="hpa"),
        pytest.param(
            [("kubectl", -HOUR, "scale"), ("kube-controller-manager", timedelta(0), "status")],
            timedelta(0),
            "not_executed",
            id="only-status-since",
        ),
        pytest.param(
            [("hpa", timedelta(minutes=-2), None)],
            timedelta(minutes=-30),
            "unknown",
            id="apiserver-clock-behind",
        ),
        pytest.param(
            [("kubectl", -HOUR, None)], timedelta(minutes=30), "not_executed", id="clock-ahead"
        ),
    ],
)
def test_a_scale_undone_by_a_later_write_is_not_disproved(
    remote: Callable[[Answerer], LyingRemote],
    entries: list[tuple[str, timedelta, str | None]],
    offset: timedelta,
    expected: str,
) -> None:
    """Asked to scale to 5, the reply lost; an HPA wrote 3 since: the scale may have landed."""
    now = datetime.now(UTC) + offset
    deployment = written(*((m, now + ago, sub) for m, ago, sub in entries))
    server = remote(apiserver(deployment, 3, offset))
    answer = kube(server.url)(facts("k8s.scale", {"cluster": "eu", **DEPLOY, "replicas": 5}))
    assert answer == expected


def test_managed_fields_with_no_date_to_place_them_prove_nothing(
    remote: Callable[[Answerer], LyingRemote],
) -> None:
    deployment = written(("kubectl", datetime.now(UTC) - HOUR, None))

    def answer(target: str) -> Script:
        document = scale_object(3) if target.endswith("/scale") else deployment
        return js(200, document, headers={"Date": ""})

    server = remote(answer)
    arguments = {"cluster": "eu", **DEPLOY, "replicas": 5}
    assert kube(server.url)(facts("k8s.scale", arguments)) == "unknown"


# -- the declarative reconciler ---------------------------------------------------------------

SEND = Check(
    get="/v1/invoices/{invoice_id}",
    committed={"status": "sent"},
    not_executed={"status": "draft"},
)


@pytest.mark.parametrize("value", ["..", ".", "%2e%2e", "a/../..", "in_1?x=1", "in_1#f"])
def test_a_key_value_cannot_steer_the_lookup_to_another_path(
    remote: Callable[[Answerer], LyingRemote], value: str
) -> None:
    """``..`` in a segment would ask ``/v1`` (httpx, like servers, removes dot segments)."""
    server = remote(always(js(200, {"status": "draft"})))
    hook = DeclarativeReconciler(server.url, [("billing.send_invoice", SEND)])
    answer = hook(facts("billing.send_invoice", {"invoice_id": value}))
    for target in server.targets:
        assert target.startswith("/v1/invoices/") and target.count("/") == 3, target
    if value in ("..", "."):
        assert answer == "unknown" and not server.targets


def test_a_lookup_by_query_asks_that_query(remote: Callable[[Answerer], LyingRemote]) -> None:
    """``get: /v1/invoices?number={invoice_id}``: httpx's ``params=`` dropped the template's
    query, so the lookup listed every invoice and judged the newest one, anyone's."""
    server = remote(always(js(200, {"data": [{"number": "in_9", "status": "draft"}]})))
    lookup = Check(
        get="/v1/invoices?number={invoice_id}&limit=1",
        committed={"data.0.status": "sent"},
        not_executed={"data.0.status": "draft"},
    )
    hook = DeclarativeReconciler(server.url, [("billing.send_invoice", lookup)])
    hook(facts("billing.send_invoice", {"invoice_id": "in 1&number=in_9"}))
    assert server.targets == ["/v1/invoices?number=in%201%26number%3Din_9&limit=1"]


# -- what a moved record carries -------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "state", "evidence"),
    [
        pytest.param(
            js(200, {**scale_object(6), "metadata": {"name": "web000", "namespace": "default"}}),
            "committed",
            "spec.replicas is 6",
            id="moved",
        ),
        pytest.param(html(404), "ambiguous", "not the apiserver's word", id="left"),
    ],
)
def test_the_answer_recorded_carries_what_the_reconciler_read(
    remote: Callable[[Answerer], LyingRemote],
    tmp_path: Path,
    reply: Script,
    state: str,
    evidence: str,
) -> None:
    """The sweep on a real SQLite ledger: the RECONCILIATION_RESOLVED event (what
    ``ctrlrun receipts`` and ``inspect`` show) says why the record moved, or did not."""
    server = remote(always(reply))
    store = SQLiteStateStore(tmp_path / "state.db")
    try:
        control = Control(Policy.from_yaml(POLICY), store)
        [key] = stuck(store, 1, utc_now() - timedelta(minutes=10), upstream="kube")
        assert sweep(control, {"kube": kube(server.url)}, ask_now=True) == [
            (key, "committed" if state == "committed" else "unknown")
        ]
        resolved = [d for t, d in events_of(store, key) if t == "RECONCILIATION_RESOLVED"]
        assert len(resolved) == 1 and evidence in resolved[0]["evidence"], resolved
        with store.reading() as conn:
            assert ledger.get_effect_row(conn, key)["state"] == state
    finally:
        store.close()
