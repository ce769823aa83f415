"""Nothing runs twice because of a clock or a settle window (issue 14, findings 1, 3 and 4).

A skewed host is a real ``ctrlrun proxy`` started with ``CTRLRUN_CLOCK_OFFSET`` (its wall clock
shifted by that many seconds). Executions are counted at the fake remote, never by the ledger.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import stripe
from e2e.harness import STRIPE_KEY, Sidecar, clean_env

from ctrlrun import ledger
from ctrlrun.store import open_store
from ctrlrun.testing import FakeKubernetes, FakeServer, FakeStripe, Request, Response

SCALE = "/apis/apps/v1/namespaces/default/deployments/web/scale"
MERGE = {"Content-Type": "application/merge-patch+json"}


def client(base: str) -> stripe.StripeClient:
    """The official client, without its own retries: each call here is one agent decision."""
    http = stripe.RequestsClient(timeout=30)
    return stripe.StripeClient(
        STRIPE_KEY, base_addresses={"api": base}, max_network_retries=0, http_client=http
    )


def refund(base: str, pi: str, amount: int = 500) -> str:
    """One refund call through a sidecar: ``ok``, or the outcome ctrlrun answered."""
    try:
        client(base).v1.refunds.create(params={"payment_intent": pi, "amount": amount})
    except stripe.StripeError as exc:
        body = exc.json_body or {}
        return str(body.get("ctrlrun", {}).get("outcome") or exc.http_status)
    return "ok"


def state(url: str, key: str) -> str | None:
    store = open_store(url, create=False)
    try:
        with store.reading() as conn:
            record = ledger.get_effect(conn, key)
        return None if record is None else record.state.value
    finally:
        store.close()


def wait_for(what: Callable[[], bool], seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_two_sidecars_120_s_apart_on_one_postgres_refund_once(
    pg_url: str,
    fakes: tuple[FakeStripe, FakeKubernetes],
    sidecars: Callable[..., Sidecar],
    tmp_path: Path,
) -> None:
    """Finding 4: B's clock is 120 s ahead, past A's whole lease (5 + 10 + 60 s). Judged on B's
    clock, A's refund, still running at Stripe, looks abandoned: B would ambiguate it, find no
    refund yet, settle it failed and refund again. Judged on the database's, it is in progress."""
    fake, kube = fakes
    pi = fake.add_payment_intent(amount=5000)["id"]
    a = sidecars(fake, kube, workdir=tmp_path / "a", store_url=pg_url)
    b = sidecars(
        fake,
        kube,
        workdir=tmp_path / "b",
        store_url=pg_url,
        admin=True,
        env=clean_env(CTRLRUN_CLOCK_OFFSET="120"),
    )
    fake.delay_next(3)  # Stripe is slow on A's refund: it is still running when B is asked
    answers: dict[str, str] = {}
    first = threading.Thread(target=lambda: answers.update(a=refund(a.stripe_base, pi)))
    first.start()
    wait_for(lambda: fake.count("POST", "/v1/refunds") == 1)
    answers["b"] = refund(b.stripe_base, pi)
    first.join(30)
    ready = httpx.get(f"{b.admin_url}/readyz", timeout=10)
    metrics = httpx.get(f"{b.admin_url}/metrics", timeout=10).text
    skew = [line for line in metrics.splitlines() if line.startswith("ctrlrun_clock_skew_seconds")]
    refunds = len(fake.refunds)
    print(f"clock offset=120s refunds={refunds} answers={answers} readyz={ready.text!r} {skew}")
    assert refunds == 1
    assert answers == {"a": "ok", "b": "in_progress"}
    assert state(pg_url, f"refund:{pi}") == "committed"
    # B says its clock is off, at start, in /readyz (still ready: it decides on the ledger's
    # clock) and in the metric.
    assert "ahead of the ledger's" in b.log.read_text()
    assert ready.status_code == 200 and "clock: this host's clock is 120" in ready.text
    assert skew and 119 < float(skew[0].split()[1]) < 121


@pytest.mark.timeout(120)
def test_a_sidecar_30_s_ahead_never_settles_a_lost_reply_refund_failed(
    fakes: tuple[FakeStripe, FakeKubernetes],
    sidecars: Callable[..., Sidecar],
    tmp_path: Path,
) -> None:
    """Finding 1: the refund is applied, its reply lost. The sidecar's clock is 30 s ahead, so
    the refund's ``created`` is before the attempt "started" by the sidecar's clock: it looked
    for refunds since then, found none, and once the attempt was a minute old (the settle
    window) answered not_executed; the agent's retry refunded again. Stripe's ``Date`` on each
    answer shows the clocks 30 s apart: nothing time-based is concluded."""
    fake, kube = fakes
    pi = fake.add_payment_intent(amount=5000)["id"]
    offset = {"CTRLRUN_CLOCK_OFFSET": "30"}
    sc = sidecars(fake, kube, workdir=tmp_path, env=clean_env(**offset))
    key = f"refund:{pi}"
    fake.fail_next("commit_then_drop")
    lost = refund(sc.stripe_base, pi)
    assert len(fake.refunds) == 1 and lost == "upstream_ambiguous"
    # The same host 65 s later (30 s ahead + 65 s): the settle window is over.
    later = _reconcile_later(sc, key, seconds=30 + 65)
    retry = refund(sc.stripe_base, pi)
    refunds = len(fake.refunds)
    print(
        f"sidecar +30s: refunds={refunds} reconcile={later!r} retry={retry} "
        f"state={sc.effect_state(key)}"
    )
    assert refunds == 1
    assert sc.effect_state(key) == "ambiguous"
    assert "not_executed" not in later
    assert retry == "ambiguous"


def _reconcile_later(sc: Sidecar, key: str, *, seconds: float) -> str:
    """``ctrlrun reconcile KEY`` on a host whose clock is ``seconds`` ahead."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ctrlrun.cli",
            "reconcile",
            key,
            "--policy",
            str(sc.policy),
            "--store-url",
            sc.store_url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=sc.workdir,
        env=clean_env(CTRLRUN_CLOCK_OFFSET=str(seconds)),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


SDK_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: allow
"""


@pytest.mark.timeout(120)
def test_sdk_stripe_refunds_eager_after_a_client_timeout_refunds_once(tmp_path: Path) -> None:
    """Finding 2: the README's ``stripe_refunds(...)`` with ``reconcile_eagerly=True``, and a
    client that gives up (1 s) while Stripe is still working (3 s). Asked at once, Stripe has
    no refund yet: answered not_executed, the record went failed and the caller's retry
    refunded again. The hook now gets the attempt's facts and waits out its settle window."""
    import ctrlrun
    from ctrlrun.reconcilers import stripe_refunds

    store = ctrlrun.SQLiteStateStore(tmp_path / "state.db")
    control = ctrlrun.Control(ctrlrun.Policy.from_yaml(SDK_POLICY), store)
    with FakeStripe() as fake:
        pi = fake.add_payment_intent(amount=5000)["id"]
        impatient = stripe.StripeClient(
            STRIPE_KEY,
            base_addresses={"api": fake.url},
            max_network_retries=0,
            http_client=stripe.RequestsClient(timeout=1),
        )

        @ctrlrun.protect(
            "stripe.refund",
            effect="refund:{payment_id}",
            reconcile=stripe_refunds(api_key=STRIPE_KEY, base_url=fake.url),
            reconcile_eagerly=True,
            control=control,
        )
        def refund(payment_id: str, amount: int) -> str:
            params: Any = {"payment_intent": payment_id, "amount": amount}
            options: Any = {"idempotency_key": ctrlrun.idempotency_token()}
            return str(impatient.v1.refunds.create(params=params, options=options).id)

        def call() -> str:
            try:
                refund(pi, 500)
            except ctrlrun.CTRLRunError as exc:
                return type(exc).__name__
            except stripe.StripeError as exc:
                return type(exc).__name__
            return "ok"

        fake.delay_next(3)
        applied_by = time.monotonic() + 3.5  # when Stripe has finished the slow refund
        with ctrlrun.context(agent="refund-bot"):
            answers = [call(), call()]  # the timeout, then the caller's retry at once
            wait_for(lambda: time.monotonic() > applied_by and len(fake.refunds) >= 1)
            answers.append(call())  # once Stripe has it: the retry's own ask finds it
        refunds = len(fake.refunds)
        with store.reading() as conn:
            record = ledger.get_effect(conn, f"refund:{pi}")
    store.close()
    print(f"sdk eager, client timeout 1 s < Stripe 3 s: refunds={refunds} answers={answers}")
    assert refunds == 1
    assert answers == ["APIConnectionError", "AmbiguousEffect", "DuplicateEffect"]
    assert record is not None and record.state.value == "committed"


class FakeBilling(FakeServer):
    """An invoice API: ``POST /v1/invoices/{id}/send`` sends it, ``GET`` reads it back."""

    def __init__(self) -> None:
        super().__init__()
        self.invoices: dict[str, dict[str, str]] = {"in_1": {"id": "in_1", "status": "draft"}}

    def handle(self, request: Request) -> Response:
        parts = request.path.strip("/").split("/")  # v1 invoices ID [send]
        invoice = self.invoices.get(parts[2]) if len(parts) >= 3 else None
        if invoice is None:
            return Response.json(404, {"error": "no such invoice"})
        if request.method == "POST" and parts[3:] == ["send"]:
            invoice["status"] = "sent"
            self._applied()
        return Response.json(200, invoice)

    def error_response(
        self, request: Request, status: int, *, applied: Response | None
    ) -> Response:
        return Response.json(status, {"error": f"injected {status}"})


BILLING_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  billing.send_invoice:
    effect: "send:{{invoice_id}}"
    decision: allow
upstreams:
  billing:
    profile: http
    url: %s
    listen: 127.0.0.1:{stripe_port}
    timeout: {timeout}
    routes:
      - method: POST
        path: /v1/invoices/{{invoice_id}}/send
        action: billing.send_invoice
        reconcile:
          get: /v1/invoices/{{invoice_id}}
          committed: {{status: sent}}
          not_executed: {{status: draft}}
"""


def _slow_write_twice(
    send: Callable[[], httpx.Response], slow: Callable[[float], None], applied: Callable[[], int]
) -> tuple[list[str], int]:
    """The remote takes 3 s on the first write; the proxy gives up after 1 s; the agent
    retries at once. Returns what the agent was told and how many writes the remote applied."""
    slow(3)
    applied_by = time.monotonic() + 3.5
    answers = []
    for _ in range(2):
        r = send()
        answers.append(r.headers.get("x-ctrlrun-outcome", str(r.status_code)))
    wait_for(lambda: time.monotonic() > applied_by)
    return answers, applied()


@pytest.mark.timeout(120)
def test_kubernetes_scale_in_flight_at_the_deadline_is_written_once(
    fakes: tuple[FakeStripe, FakeKubernetes], sidecars: Callable[..., Sidecar]
) -> None:
    """Finding 3: a scale still being applied when the proxy's deadline fires. Asked at once,
    the apiserver still says 3 replicas: answered not_executed, the retry was forwarded, and
    the cluster applied two writes. Inside the settle window the answer is unknown."""
    fake, kube = fakes
    kube.add_deployment("default", "web", replicas=3)
    sc = sidecars(fake, kube, timeout=1)
    with httpx.Client(base_url=sc.kube_base, timeout=30, trust_env=False) as agent:
        answers, writes = _slow_write_twice(
            lambda: agent.patch(SCALE, content=b'{"spec":{"replicas":6}}', headers=MERGE),
            kube.delay_next,
            lambda: kube.writes_applied,
        )
    key_state = sc.effect_state("scale:prod-eu:web:6")
    print(f"kubernetes slow scale: writes={writes} answers={answers} state={key_state}")
    assert writes == 1
    assert answers == ["upstream_ambiguous", "ambiguous"]
    assert key_state == "ambiguous"  # until the window is over and it is asked again


@pytest.mark.timeout(120)
def test_declarative_write_in_flight_at_the_deadline_is_written_once(
    fakes: tuple[FakeStripe, FakeKubernetes], sidecars: Callable[..., Sidecar]
) -> None:
    """Finding 3, for a ``profile: http`` route with a declarative reconciler: the invoice
    still reads ``draft`` while its send is being applied."""
    fake, kube = fakes
    with FakeBilling() as billing:
        policy = BILLING_POLICY % billing.url
        sc = sidecars(fake, kube, timeout=1, policy_text=policy)
        with httpx.Client(base_url=sc.stripe_base, timeout=30, trust_env=False) as agent:
            answers, writes = _slow_write_twice(
                lambda: agent.post("/v1/invoices/in_1/send"),
                billing.delay_next,
                lambda: billing.writes_applied,
            )
        key_state = sc.effect_state("send:in_1")
    print(f"declarative slow send: writes={writes} answers={answers} state={key_state}")
    assert writes == 1
    assert answers == ["upstream_ambiguous", "ambiguous"]
    assert key_state == "ambiguous"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["def", "async def"])
def test_a_function_that_outlives_its_lease_keeps_its_key(tmp_path: Path, kind: str) -> None:
    """Finding 2, its second half: a call runs 3 s under a 1 s lease. A retry at 1.5 s found
    the lease expired, a hook that had nothing to find yet answered not_executed, and the
    effect ran twice. The lease is renewed while the function runs: the retry is in progress."""
    import asyncio
    from datetime import timedelta

    import ctrlrun

    store = ctrlrun.SQLiteStateStore(tmp_path / "state.db")
    control = ctrlrun.Control(ctrlrun.Policy.from_yaml(SDK_POLICY), store)
    ran: list[str] = []

    def nothing_there_yet(effect_key: str) -> ctrlrun.ReconcileOutcome:
        return "committed" if ran else "not_executed"  # the effect lands when the call ends

    protect = ctrlrun.protect(
        "stripe.refund",
        effect="refund:{payment_id}",
        reconcile=nothing_there_yet,
        lease=timedelta(seconds=1),
        control=control,
    )

    @protect
    def slow(payment_id: str) -> None:
        time.sleep(3)
        ran.append(payment_id)

    @protect
    async def slow_async(payment_id: str) -> None:
        await asyncio.sleep(3)
        ran.append(payment_id)

    def call() -> str:
        with ctrlrun.context(agent="refund-bot"):
            try:
                if kind == "def":
                    slow("pi_1")
                else:
                    asyncio.run(slow_async("pi_1"))
            except ctrlrun.CTRLRunError as exc:
                return f"{type(exc).__name__}({getattr(exc, 'state', '')})"
        return "ok"

    answers: list[str] = []
    first = threading.Thread(target=lambda: answers.append(call()))
    first.start()
    time.sleep(1.5)
    answers.append(call())  # the retry, while the first still runs
    first.join(30)
    store.close()
    print(f"{kind} 3 s under a 1 s lease: executions={len(ran)} answers={answers}")
    assert len(ran) == 1
    assert answers == ["DuplicateEffect(in_progress)", "ok"]
