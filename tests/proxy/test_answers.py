"""Synthesised answers: status per outcome and profile, shapes, and what real clients do."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ctrlrun.proxy.answers import Answer, answer

OUTCOMES = [
    # outcome, stripe, kubernetes, http
    ("denied", 403, 403, 403),
    ("approval_required", 403, 403, 403),
    ("approval_invalid", 403, 403, 403),
    ("duplicate", 409, 403, 409),
    ("in_progress", 409, 403, 409),
    ("ambiguous", 409, 403, 409),
    ("upstream_ambiguous", 504, 504, 504),
    ("invalid_request", 400, 422, 400),
    ("unavailable", 503, 503, 503),
]
CASES = [
    (profile, outcome, row[index])
    for outcome, *row in OUTCOMES
    for index, profile in enumerate(("stripe", "kubernetes", "http"))
]
KEY = "refund:pi_1"
REQUEST_ID = "apr_" + "a" * 32


def make(profile: str, outcome: str, **overrides: Any) -> Answer:
    arguments: dict[str, Any] = {
        "reason": "policy_deny",
        "message": "refund of pi_1 refused",
        "action": "stripe.refund",
        "effect_key": KEY,
        "receipt_id": "ctr_" + "b" * 32,
        "request_id": REQUEST_ID if outcome == "approval_required" else None,
    }
    arguments.update(overrides)
    return answer(profile, outcome, **arguments)


def parsed(result: Answer) -> dict[str, Any]:
    body = json.loads(result.body)
    assert isinstance(body, dict)
    return body


def message_of(profile: str, body: dict[str, Any]) -> str:
    text = body["message"] if profile == "kubernetes" else body["error"]["message"]
    assert isinstance(text, str)
    return text


@pytest.mark.parametrize(("profile", "outcome", "status"), CASES)
def test_status_headers_and_block(profile: str, outcome: str, status: int) -> None:
    result = make(profile, outcome)
    assert result.status == status
    headers = dict(result.headers)
    assert headers["X-Ctrlrun-Outcome"] == outcome
    assert headers["Content-Type"] == "application/json"
    assert not any(name.lower() == "retry-after" for name, _ in result.headers)
    assert (headers.get("Stripe-Should-Retry") == "false") is (profile == "stripe")
    body = parsed(result)
    block = body["ctrlrun"]
    assert block["outcome"] == outcome
    assert block["reason"] == "policy_deny"
    assert block["action"] == "stripe.refund"
    assert block["effect_key"] == KEY
    assert block["receipt_id"] == "ctr_" + "b" * 32
    assert ("request_id" in block) is (outcome == "approval_required")
    assert message_of(profile, body).startswith("ctrlrun: refund of pi_1 refused. ")


@pytest.mark.parametrize(("outcome", "status"), [(o, row[0]) for o, *row in OUTCOMES])
def test_stripe_shape(outcome: str, status: int) -> None:
    error = parsed(make("stripe", outcome))["error"]
    assert error["type"] == ("api_error" if status >= 500 else "invalid_request_error")
    assert error["code"] == f"ctrlrun_{outcome}"


@pytest.mark.parametrize(("outcome", "status"), [(o, row[1]) for o, *row in OUTCOMES])
def test_kubernetes_status_object(outcome: str, status: int) -> None:
    body = parsed(make("kubernetes", outcome))
    assert status != 409  # kubectl scale retries a conflict for five minutes
    assert body["kind"] == "Status"
    assert body["apiVersion"] == "v1"
    assert body["status"] == "Failure"
    assert body["code"] == status
    reasons = {403: "Forbidden", 422: "Invalid", 503: "ServiceUnavailable", 504: "Timeout"}
    assert body["reason"] == reasons[status]
    assert body["details"]["causes"][0]["reason"] == f"ctrlrun_{outcome}"
    assert "retryAfterSeconds" not in body["details"]


@pytest.mark.parametrize("outcome", [o for o, *_ in OUTCOMES])
def test_http_shape(outcome: str) -> None:
    body = parsed(make("http", outcome))
    assert body["error"]["code"] == f"ctrlrun_{outcome}"
    assert set(body) == {"error", "ctrlrun"}


@pytest.mark.parametrize(
    ("outcome", "request_id", "effect_key", "fragments"),
    [
        (
            "approval_required",
            REQUEST_ID,
            KEY,
            [f"run 'ctrlrun approve {REQUEST_ID}'", f"Ctrlrun-Approval: {REQUEST_ID}"],
        ),
        ("approval_invalid", None, KEY, ["without Ctrlrun-Approval"]),
        ("denied", None, KEY, ["do not retry"]),
        ("duplicate", None, "Refund:PI_1", ["Effect 'Refund:PI_1' has already happened"]),
        ("in_progress", None, KEY, ["Another attempt"]),
        ("ambiguous", None, KEY, [f"ctrlrun resolve {KEY}", "wait for reconciliation"]),
        ("ambiguous", None, "scale:a b", ["ctrlrun resolve 'scale:a b'"]),
        ("ambiguous", None, None, ["ctrlrun resolve KEY", "this effect"]),
        ("upstream_ambiguous", None, KEY, [f"ctrlrun reconcile {KEY}", "do not retry blindly"]),
        ("invalid_request", None, None, ["fix the request"]),
        ("unavailable", None, None, ["Nothing was forwarded"]),
    ],
)
def test_message_says_what_to_do_next(
    outcome: str, request_id: str | None, effect_key: str | None, fragments: list[str]
) -> None:
    result = make("http", outcome, request_id=request_id, effect_key=effect_key)
    text = message_of("http", parsed(result))
    for fragment in fragments:
        assert fragment in text


def test_caller_prefix_is_not_doubled() -> None:
    result = make("http", "denied", message="ctrlrun: no principal.")
    assert message_of("http", parsed(result)).startswith("ctrlrun: no principal. Nothing")


def test_body_is_ascii_whatever_the_text() -> None:
    result = make("kubernetes", "invalid_request", message="bad \r\n body ✗", reason="x\ny")
    assert result.body.isascii()
    assert "bad \r\n body ✗" in parsed(result)["message"]


@pytest.mark.parametrize(("profile", "outcome"), [("grpc", "denied"), ("http", "refused")])
def test_unknown_profile_or_outcome(profile: str, outcome: str) -> None:
    with pytest.raises(ValueError):
        make(profile, outcome)


# --- what the real client libraries do with these answers -----------------------------------


class _Server:
    """Serve one fixed Answer on loopback and count the requests."""

    def __init__(self, result: Answer) -> None:
        self.count = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                owner.count += 1
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(result.status)
                for name, value in result.headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(result.body)))
                self.end_headers()
                self.wfile.write(result.body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> _Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    yield


@pytest.mark.parametrize(
    "outcome",
    ["denied", "duplicate", "in_progress", "upstream_ambiguous", "unavailable", "invalid_request"],
)
def test_stripe_client_raises_once_without_retrying(outcome: str) -> None:
    stripe = pytest.importorskip("stripe")
    with _Server(make("stripe", outcome)) as server:
        client = stripe.StripeClient(
            "sk_test_ctrlrun", base_addresses={"api": server.url}, max_network_retries=2
        )
        with pytest.raises(stripe.StripeError) as raised:
            client.v1.refunds.create(params={"payment_intent": "pi_1", "amount": 500})
    assert "ctrlrun:" in str(raised.value)
    assert raised.value.http_status == make("stripe", outcome).status
    # 409 and 5xx would be retried twice without Stripe-Should-Retry: false.
    assert server.count == 1


@pytest.mark.parametrize("outcome", ["denied", "duplicate", "upstream_ambiguous"])
def test_kubernetes_client_raises_api_exception(outcome: str) -> None:
    kubernetes = pytest.importorskip("kubernetes")
    expected = make("kubernetes", outcome)
    with _Server(expected) as server:
        configuration = kubernetes.client.Configuration(host=server.url)
        with kubernetes.client.ApiClient(configuration) as api_client:
            apps = kubernetes.client.AppsV1Api(api_client)
            with pytest.raises(kubernetes.client.ApiException) as raised:
                apps.patch_namespaced_deployment_scale("web", "prod", {"spec": {"replicas": 6}})
    assert raised.value.status == expected.status
    assert "ctrlrun:" in raised.value.body
    assert raised.value.headers["X-Ctrlrun-Outcome"] == outcome
    assert server.count == 1
