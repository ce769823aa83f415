"""The fake Stripe: a real HTTP server driven with httpx and the official stripe client."""

from __future__ import annotations

import base64
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import stripe

from ctrlrun.testing import FakeStripe

KEY = "sk_test_fake123"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def fake() -> Iterator[FakeStripe]:
    with FakeStripe(hang_seconds=0.5) as server:
        yield server


@pytest.fixture
def http(fake: FakeStripe) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake.url, headers=AUTH, timeout=5, trust_env=False) as client:
        yield client


@pytest.fixture
def sdk(fake: FakeStripe) -> stripe.StripeClient:
    return stripe.StripeClient(KEY, base_addresses={"api": fake.url}, max_network_retries=0)


def refund(http: httpx.Client, pi: str, key: str | None = None, **fields: str) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    return http.post("/v1/refunds", data={"payment_intent": pi, **fields}, headers=headers)


# -- the API -----------------------------------------------------------------------------------


def test_refund_is_created_with_stripe_shapes(fake: FakeStripe, http: httpx.Client) -> None:
    pi = fake.add_payment_intent(amount=5000)
    assert pi["id"].startswith("pi_") and pi["latest_charge"].startswith("ch_")

    answer = refund(http, pi["id"], amount="1200", reason="duplicate", **{"metadata[order]": "7"})

    assert answer.status_code == 200
    assert answer.headers["Request-Id"].startswith("req_")
    body = answer.json()
    assert body["object"] == "refund" and body["id"].startswith("re_")
    assert (body["amount"], body["payment_intent"], body["charge"]) == (
        1200,
        pi["id"],
        pi["latest_charge"],
    )
    assert body["metadata"] == {"order": "7"} and body["reason"] == "duplicate"
    assert isinstance(body["created"], int)
    assert fake.refunds == [body]
    assert fake.charge(pi["latest_charge"])["amount_refunded"] == 1200
    assert fake.writes_applied == 1
    assert http.get(f"/v1/refunds/{body['id']}").json() == body


def test_refund_defaults_to_remaining_and_refuses_over_refunds(
    fake: FakeStripe, http: httpx.Client
) -> None:
    pi = fake.add_payment_intent(amount=1000)
    assert refund(http, pi["id"], amount="300").json()["amount"] == 300
    too_much = refund(http, pi["id"], amount="701")
    assert too_much.status_code == 400
    assert too_much.json()["error"]["code"] == "amount_too_large"
    assert refund(http, pi["id"]).json()["amount"] == 700
    again = refund(http, pi["id"])
    assert again.status_code == 400
    assert again.json()["error"] == {
        "type": "invalid_request_error",
        "code": "charge_already_refunded",
        "message": f"Charge {pi['latest_charge']} has already been refunded.",
    }
    assert fake.writes_applied == 2 and len(fake.refunds) == 2


@pytest.mark.parametrize(
    ("data", "code"),
    [
        ({}, "parameter_missing"),
        ({"payment_intent": "pi_nope"}, "resource_missing"),
        ({"payment_intent": "PI", "amount": "1.5"}, "parameter_invalid_integer"),
        ({"payment_intent": "PI", "amount": "0"}, "parameter_invalid_integer"),
        ({"payment_intent": "PI", "reason": "bored"}, "parameter_invalid_string"),
    ],
)
def test_bad_refund_requests(
    fake: FakeStripe, http: httpx.Client, data: dict[str, str], code: str
) -> None:
    pi = fake.add_payment_intent()
    data = {k: pi["id"] if v == "PI" else v for k, v in data.items()}
    answer = http.post("/v1/refunds", data=data)
    assert answer.status_code in (400, 404)
    assert answer.json()["error"]["code"] == code
    assert fake.refunds == [] and fake.writes_applied == 0


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer sk_live_abc", "Bearer nonsense", "Token sk_test_abc", "Bearer"],
)
def test_a_test_key_is_required(fake: FakeStripe, authorization: str | None) -> None:
    pi = fake.add_payment_intent()
    headers = {"Authorization": authorization} if authorization else {}
    answer = httpx.post(
        f"{fake.url}/v1/refunds", data={"payment_intent": pi["id"]}, headers=headers
    )
    assert answer.status_code == 401
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert answer.headers["Request-Id"].startswith("req_")
    assert fake.refunds == [] and fake.count("POST", "/v1/refunds") == 1


def test_basic_auth_with_the_key_works_and_the_key_is_never_kept(fake: FakeStripe) -> None:
    pi = fake.add_payment_intent()
    basic = "Basic " + base64.b64encode(f"{KEY}:".encode()).decode()
    answer = httpx.post(
        f"{fake.url}/v1/refunds",
        data={"payment_intent": pi["id"]},
        headers={"Authorization": basic, "Idempotency-Key": "k"},
    )
    assert answer.status_code == 200
    platform = fake._accounts.get(None)
    kept = repr(vars(fake)) + repr(vars(platform.state)) + repr(vars(platform.idempotency))
    assert KEY not in kept and "Basic" not in kept


def test_unknown_url_answers_a_stripe_404(http: httpx.Client) -> None:
    answer = http.post("/v1/nothing", data={"a": "1"})
    assert answer.status_code == 404
    assert answer.json()["error"]["message"].startswith("Unrecognized request URL (POST")


# -- idempotency -------------------------------------------------------------------------------


def test_same_key_same_body_replays_without_applying(fake: FakeStripe, http: httpx.Client) -> None:
    pi = fake.add_payment_intent(amount=1000)
    first = refund(http, pi["id"], "key-1", amount="100")
    second = refund(http, pi["id"], "key-1", amount="100")
    assert "Idempotent-Replayed" not in first.headers
    assert second.headers["Idempotent-Replayed"] == "true"
    assert second.json() == first.json()
    assert second.headers["Request-Id"] != first.headers["Request-Id"]
    assert fake.writes_applied == 1 and len(fake.refunds) == 1
    assert fake.count("POST", "/v1/refunds") == 2


def test_same_key_other_parameters_is_an_idempotency_error(
    fake: FakeStripe, http: httpx.Client
) -> None:
    pi = fake.add_payment_intent(amount=1000)
    refund(http, pi["id"], "key-1", amount="100")
    other = refund(http, pi["id"], "key-1", amount="200")
    assert other.status_code == 400
    assert other.json()["error"]["type"] == "idempotency_error"
    assert len(fake.refunds) == 1


def test_executed_errors_are_stored_but_validation_errors_are_not(
    fake: FakeStripe, http: httpx.Client
) -> None:
    pi = fake.add_payment_intent(amount=1000)
    assert refund(http, pi["id"], "k-over", amount="5000").status_code == 400
    replay = refund(http, pi["id"], "k-over", amount="5000")
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json()["error"]["code"] == "amount_too_large"

    assert refund(http, pi["id"], "k-bad", amount="x").status_code == 400
    fixed = refund(http, pi["id"], "k-bad", amount="10")
    assert fixed.status_code == 200 and "Idempotent-Replayed" not in fixed.headers


# -- lists and events --------------------------------------------------------------------------


def test_paging_250_refunds_newest_first(fake: FakeStripe, http: httpx.Client) -> None:
    pi = fake.add_payment_intent(amount=10**6)
    other = fake.add_payment_intent(amount=10**6)
    base = 1_700_000_000
    target = fake.add_refund(
        payment_intent=pi["id"], amount=7, created=base, idempotency_key="the-one"
    )
    for i in range(1, 250):
        fake.add_refund(payment_intent=pi["id"], amount=1, created=base + i)
        if i % 50 == 0:
            fake.add_refund(payment_intent=other["id"], amount=1, created=base + i)

    pages: list[list[dict[str, Any]]] = []
    params: dict[str, Any] = {"payment_intent": pi["id"], "limit": 100}
    for _ in range(5):  # bounded: 3 pages expected
        page = http.get("/v1/refunds", params=params).json()
        assert page["object"] == "list" and page["url"] == "/v1/refunds"
        pages.append(page["data"])
        if not page["has_more"]:
            break
        params["starting_after"] = page["data"][-1]["id"]
    assert [len(p) for p in pages] == [100, 100, 50]
    flat = [r for p in pages for r in p]
    assert len({r["id"] for r in flat}) == 250
    assert [r["created"] for r in flat] == sorted((r["created"] for r in flat), reverse=True)
    assert pages[2][-1]["id"] == target["id"]

    back = http.get(
        "/v1/refunds",
        params={"payment_intent": pi["id"], "limit": 100, "ending_before": pages[2][0]["id"]},
    ).json()
    assert [r["id"] for r in back["data"]] == [r["id"] for r in pages[1]]
    assert back["has_more"] is True
    default = http.get("/v1/refunds").json()
    assert len(default["data"]) == 10 and default["has_more"] is True


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"created": "105"}, [105]),
        ({"created[gte]": "108"}, [109, 108]),
        ({"created[gt]": "108"}, [109]),
        ({"created[lt]": "102"}, [101, 100]),
        ({"created[lte]": "101", "created[gte]": "101"}, [101]),
    ],
)
def test_created_filters(
    fake: FakeStripe, http: httpx.Client, params: dict[str, str], expected: list[int]
) -> None:
    pi = fake.add_payment_intent(amount=1000)
    for created in range(100, 110):
        fake.add_refund(payment_intent=pi["id"], amount=1, created=created)
    data = http.get("/v1/refunds", params={"charge": pi["latest_charge"], **params}).json()["data"]
    assert [r["created"] for r in data] == expected


@pytest.mark.parametrize("limit", ["0", "101", "ten"])
def test_bad_limits(http: httpx.Client, limit: str) -> None:
    answer = http.get("/v1/refunds", params={"limit": limit})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "limit"


def test_events_carry_the_request_and_its_idempotency_key(
    fake: FakeStripe, http: httpx.Client
) -> None:
    pi = fake.add_payment_intent(amount=1000)
    answer = refund(http, pi["id"], "agent-key-9", amount="10")
    events = http.get("/v1/events", params={"type": "refund.created"}).json()["data"]
    assert len(events) == 1
    assert events[0]["request"] == {
        "id": answer.headers["Request-Id"],
        "idempotency_key": "agent-key-9",
    }
    assert events[0]["data"]["object"]["id"] == answer.json()["id"]
    everything = http.get("/v1/events", params={"type": "refund.*"}).json()["data"]
    assert [e["type"] for e in everything] == ["refund.created"]
    later = http.get("/v1/events", params={"created[gte]": str(events[0]["created"] + 1)})
    assert later.json()["data"] == []
    assert http.get(f"/v1/events/{events[0]['id']}").json() == events[0]


def test_cancel_payment_intent(fake: FakeStripe, http: httpx.Client) -> None:
    pi = fake.add_payment_intent(amount=500, status="requires_capture")
    first = http.post(
        f"/v1/payment_intents/{pi['id']}/cancel", data={"cancellation_reason": "abandoned"}
    )
    assert first.status_code == 200 and first.json()["status"] == "canceled"
    assert http.get(f"/v1/payment_intents/{pi['id']}").json()["cancellation_reason"] == "abandoned"
    again = http.post(f"/v1/payment_intents/{pi['id']}/cancel")
    assert again.status_code == 400
    assert again.json()["error"]["code"] == "payment_intent_unexpected_state"
    assert fake.writes_applied == 1
    assert http.get("/v1/payment_intents/pi_missing").status_code == 404


def test_payouts_charges_and_customers(fake: FakeStripe, http: httpx.Client) -> None:
    payout = http.post(
        "/v1/payouts", data={"amount": "900", "currency": "eur", "metadata[run]": "1"}
    ).json()
    assert (payout["object"], payout["amount"], payout["metadata"]) == ("payout", 900, {"run": "1"})
    assert fake.payouts == [payout]
    charge = http.post("/v1/charges", data={"amount": "250", "currency": "usd"}).json()
    assert charge["id"].startswith("ch_") and charge["status"] == "succeeded"
    assert http.post("/v1/payouts", data={"currency": "eur"}).status_code == 400

    customer = fake.add_customer(email="a@example.com")
    deleted = http.delete(f"/v1/customers/{customer['id']}")
    assert deleted.json() == {"id": customer["id"], "object": "customer", "deleted": True}
    assert http.delete(f"/v1/customers/{customer['id']}").status_code == 404
    assert fake.writes_applied == 3


def test_list_payouts_and_charges_and_seed_errors(fake: FakeStripe, http: httpx.Client) -> None:
    pi = fake.add_payment_intent(amount=700)
    http.post("/v1/payouts", data={"amount": "1", "currency": "usd"})
    assert [p["amount"] for p in http.get("/v1/payouts").json()["data"]] == [1]
    charges = http.get("/v1/charges", params={"payment_intent": pi["id"]}).json()["data"]
    assert [c["id"] for c in charges] == [pi["latest_charge"]]
    with pytest.raises(KeyError):
        fake.payment_intent("pi_missing")
    with pytest.raises(ValueError):
        waiting = fake.add_payment_intent(status="requires_payment_method")
        fake.add_refund(payment_intent=waiting["id"], amount=1)


def test_official_stripe_client(fake: FakeStripe, sdk: stripe.StripeClient) -> None:
    pi = fake.add_payment_intent(amount=2000)
    created = sdk.v1.refunds.create(
        params={"payment_intent": pi["id"], "amount": 500, "metadata": {"order_id": "1"}}
    )
    assert created.amount == 500 and created.metadata["order_id"] == "1"
    for _ in range(12):
        fake.add_refund(payment_intent=pi["id"], amount=1)
    listed = sdk.v1.refunds.list(params={"payment_intent": pi["id"], "limit": 5})
    assert len(list(listed.auto_paging_iter())) == 13
    with pytest.raises(stripe.InvalidRequestError) as refused:
        sdk.v1.refunds.create(params={"payment_intent": pi["id"], "amount": 10**6})
    assert refused.value.code == "amount_too_large"
    sdk.v1.refunds.create(
        params={"payment_intent": pi["id"], "amount": 1}, options={"idempotency_key": "x"}
    )
    with pytest.raises(stripe.IdempotencyError):
        sdk.v1.refunds.create(
            params={"payment_intent": pi["id"], "amount": 2}, options={"idempotency_key": "x"}
        )
    waiting = fake.add_payment_intent(status="requires_payment_method")
    assert sdk.v1.payment_intents.cancel(waiting["id"]).status == "canceled"
    with pytest.raises(stripe.AuthenticationError):
        stripe.StripeClient("sk_live_x", base_addresses={"api": fake.url}).v1.refunds.list()


# -- failure injection -------------------------------------------------------------------------


def test_commit_then_drop_applies_then_closes_without_an_answer(
    fake: FakeStripe, http: httpx.Client
) -> None:
    pi = fake.add_payment_intent(amount=1000)
    fake.fail_next("commit_then_drop")
    with pytest.raises(httpx.RemoteProtocolError):
        refund(http, pi["id"], "k1", amount="100")
    assert len(fake.refunds) == 1 and fake.writes_applied == 1
    retry = refund(http, pi["id"], "k1", amount="100")
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert retry.json()["id"] == fake.refunds[0]["id"] and fake.writes_applied == 1


def test_commit_then_500_applies_and_stores_the_500(fake: FakeStripe, http: httpx.Client) -> None:
    pi = fake.add_payment_intent(amount=1000)
    fake.fail_next("commit_then_500")
    answer = refund(http, pi["id"], "k1", amount="100")
    assert answer.status_code == 500 and answer.json()["error"]["type"] == "api_error"
    assert len(fake.refunds) == 1
    replay = refund(http, pi["id"], "k1", amount="100")
    assert replay.status_code == 500 and replay.headers["Idempotent-Replayed"] == "true"


def test_reset_before_sends_a_tcp_reset_and_applies_nothing(fake: FakeStripe) -> None:
    pi = fake.add_payment_intent()
    fake.fail_next("reset_before")
    body = f"payment_intent={pi['id']}".encode()
    request = (
        f"POST /v1/refunds HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection((fake.host, fake.port), timeout=5) as sock:
        sock.sendall(request)
        with pytest.raises(ConnectionResetError):
            sock.recv(1024)
    assert fake.refunds == [] and fake.writes_applied == 0


def test_reset_before_seen_by_httpx(fake: FakeStripe, http: httpx.Client) -> None:
    pi = fake.add_payment_intent()
    fake.fail_next("reset_before")
    with pytest.raises(httpx.ReadError):
        refund(http, pi["id"])
    assert fake.refunds == []
    assert refund(http, pi["id"]).status_code == 200


def test_hang_is_bounded_and_applies_nothing(fake: FakeStripe, http: httpx.Client) -> None:
    pi = fake.add_payment_intent()
    fake.fail_next("hang")
    started = time.monotonic()
    with pytest.raises(httpx.RemoteProtocolError):
        refund(http, pi["id"])
    assert 0.4 <= time.monotonic() - started < 4
    assert fake.refunds == []


def test_a_hung_request_ends_when_the_server_stops() -> None:
    fake = FakeStripe(hang_seconds=30).start()
    pi = fake.add_payment_intent()
    fake.fail_next("hang")
    errors: list[Exception] = []

    def call() -> None:
        try:
            httpx.post(f"{fake.url}/v1/refunds", data={"payment_intent": pi["id"]}, headers=AUTH)
        except httpx.HTTPError as exc:
            errors.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    for _ in range(100):
        if fake.count("POST"):
            break
        time.sleep(0.02)
    started = time.monotonic()
    fake.stop()
    worker.join(10)
    assert not worker.is_alive() and time.monotonic() - started < 5
    assert len(errors) == 1


@pytest.mark.parametrize("status", [400, 402, 404, 408, 409, 424, 429, 500, 502, 503, 504])
def test_injected_statuses(fake: FakeStripe, http: httpx.Client, status: int) -> None:
    pi = fake.add_payment_intent()
    fake.fail_next(status)
    answer = refund(http, pi["id"])
    assert answer.status_code == status
    error = answer.json()["error"]
    assert set(error) == {"type", "code", "message"} and error["message"]
    assert error["type"] == ("card_error" if status == 402 else error["type"])
    assert answer.headers["Request-Id"].startswith("req_")
    assert fake.refunds == [] and fake.writes_applied == 0
    assert refund(http, pi["id"]).status_code == 200  # times=1: the next write goes through


def test_injected_5xx_is_stored_for_its_key_but_429_is_not(
    fake: FakeStripe, http: httpx.Client
) -> None:
    pi = fake.add_payment_intent(amount=1000)
    fake.fail_next(503)
    assert refund(http, pi["id"], "k5", amount="1").status_code == 503
    replay = refund(http, pi["id"], "k5", amount="1")
    assert (replay.status_code, replay.headers["Idempotent-Replayed"]) == (503, "true")
    fake.fail_next(429)
    assert refund(http, pi["id"], "k4", amount="1").status_code == 429
    assert refund(http, pi["id"], "k4", amount="1").status_code == 200
    assert len(fake.refunds) == 1


def test_write_failures_skip_reads_and_count_down(fake: FakeStripe, http: httpx.Client) -> None:
    pi = fake.add_payment_intent(amount=1000)
    fake.fail_next(500, times=2)
    assert http.get("/v1/refunds").status_code == 200
    assert refund(http, pi["id"], amount="1").status_code == 500
    assert refund(http, pi["id"], amount="1").status_code == 500
    assert refund(http, pi["id"], amount="1").status_code == 200
    fake.fail_next(502, path="/v1/payouts")
    assert refund(http, pi["id"], amount="1").status_code == 200
    assert http.post("/v1/payouts", data={"amount": "1", "currency": "usd"}).status_code == 502
    fake.fail_next(500)
    fake.fail_next(None)
    assert refund(http, pi["id"], amount="1").status_code == 200


def test_read_failures(fake: FakeStripe, http: httpx.Client) -> None:
    pi = fake.add_payment_intent(amount=1000)
    fake.fail_reads(503)
    for _ in range(3):
        assert http.get("/v1/refunds").status_code == 503
    assert refund(http, pi["id"], amount="1").status_code == 200  # writes are unaffected
    fake.fail_reads(None)
    assert http.get("/v1/refunds").status_code == 200
    fake.fail_reads("drop", times=1)
    with pytest.raises(httpx.RemoteProtocolError):
        http.get("/v1/refunds")
    assert http.get("/v1/refunds").status_code == 200
    fake.fail_reads("hang", times=1, path="/v1/events")
    assert http.get("/v1/refunds").status_code == 200
    with pytest.raises(httpx.ReadTimeout):
        http.get("/v1/events", timeout=0.2)


def test_delay_next_applies_after_the_delay(fake: FakeStripe, http: httpx.Client) -> None:
    pi = fake.add_payment_intent()
    fake.delay_next(0.3)
    started = time.monotonic()
    assert refund(http, pi["id"]).status_code == 200
    assert time.monotonic() - started >= 0.3 and len(fake.refunds) == 1


@pytest.mark.parametrize("mode", ["explode", 200, 418, True])
def test_unknown_failure_modes_are_refused(fake: FakeStripe, mode: Any) -> None:
    with pytest.raises(ValueError):
        fake.fail_next(mode)


def test_stripe_client_sees_a_dropped_commit_as_a_connection_error(
    fake: FakeStripe, sdk: stripe.StripeClient
) -> None:
    pi = fake.add_payment_intent()
    fake.fail_next("commit_then_drop")
    with pytest.raises(stripe.APIConnectionError):
        sdk.v1.refunds.create(params={"payment_intent": pi["id"]})
    assert len(fake.refunds) == 1


# -- the server --------------------------------------------------------------------------------


def test_counts(fake: FakeStripe, http: httpx.Client) -> None:
    pi = fake.add_payment_intent()
    http.get(f"/v1/payment_intents/{pi['id']}", params={"expand[]": "latest_charge"})
    refund(http, pi["id"])
    assert fake.requests == [("GET", f"/v1/payment_intents/{pi['id']}"), ("POST", "/v1/refunds")]
    assert fake.count() == 2 and fake.count("post") == 1 and fake.count(path="/v1/pay") == 1
    fake.reset_counts()
    assert fake.requests == [] and fake.writes_applied == 0


def test_keep_alive_and_connection_close(fake: FakeStripe) -> None:
    request = f"GET /v1/refunds HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n"
    with socket.create_connection((fake.host, fake.port), timeout=5) as sock:
        for _ in range(3):  # three answers on one connection
            sock.sendall(request.encode())
            assert _read_answer(sock).startswith(b"HTTP/1.1 200 OK")
        sock.sendall(request.replace("\r\n\r\n", "\r\nConnection: close\r\n\r\n").encode())
        assert b"Connection: close" in _read_answer(sock)
        assert sock.recv(10) == b""


def test_chunked_bodies_and_garbage(fake: FakeStripe) -> None:
    pi = fake.add_payment_intent()
    form = f"payment_intent={pi['id']}&amount=5".encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(form), form)
    head = f"POST /v1/refunds HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
    with socket.create_connection((fake.host, fake.port), timeout=5) as sock:
        sock.sendall(head.encode() + b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
        assert _read_answer(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(b"NONSENSE\r\n\r\n")
        assert _read_answer(sock).startswith(b"HTTP/1.1 400")
    assert fake.refunds[0]["amount"] == 5


def test_restart_on_the_same_port_keeps_state() -> None:
    fake = FakeStripe().start()
    pi = fake.add_payment_intent()
    url = fake.url
    fake.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/v1/refunds", headers=AUTH)
    fake.start()
    try:
        assert fake.url == url
        assert httpx.get(f"{url}/v1/payment_intents/{pi['id']}", headers=AUTH).status_code == 200
    finally:
        fake.stop()


def test_tls_mode_with_the_test_ca() -> None:
    with FakeStripe(tls=True) as fake:
        assert fake.url.startswith("https://127.0.0.1:") and fake.ca_file is not None
        trust = ssl.create_default_context(cafile=str(fake.ca_file))
        with httpx.Client(verify=trust, headers=AUTH) as client:
            assert client.get(f"{fake.url}/v1/refunds").status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{fake.url}/v1/refunds", headers=AUTH)  # default trust store
        client_sdk = stripe.StripeClient(
            KEY, base_addresses={"api": fake.url}, max_network_retries=0
        )
        stripe_ca = stripe.ca_bundle_path
        stripe.ca_bundle_path = str(fake.ca_file)
        try:
            pi = fake.add_payment_intent()
            assert client_sdk.v1.payment_intents.retrieve(pi["id"]).id == pi["id"]
        finally:
            stripe.ca_bundle_path = stripe_ca


def _read_answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before the answer"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body
