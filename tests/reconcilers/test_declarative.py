"""DeclarativeReconciler against a small billing API served by the fakes' own HTTP server."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ctrlrun.errors import InvalidArgument
from ctrlrun.reconcilers import Check, DeclarativeReconciler, DeclarativeTarget, EffectFacts
from ctrlrun.reconcilers.declarative import holds, same
from ctrlrun.reconcilers.http import SETTLE_MARGIN
from ctrlrun.testing import FakeServer, Request, Response


class FakeBilling(FakeServer):
    """``GET /v1/invoices/{id}`` answers the stored invoice; anything else is a 404."""

    def __init__(self) -> None:
        super().__init__()
        self.invoices: dict[str, Any] = {}
        self.authorizations: list[str] = []

    def handle(self, request: Request) -> Response:
        self.authorizations.append(request.header("authorization"))
        prefix = "/v1/invoices/"
        invoice = self.invoices.get(request.path.removeprefix(prefix))
        if request.method != "GET" or not request.path.startswith(prefix) or invoice is None:
            return Response.json(404, {"error": "not found"})
        return Response.json(200, invoice)

    def error_response(
        self, request: Request, status: int, *, applied: Response | None
    ) -> Response:
        return Response.json(status, {"error": f"injected {status}"})


SEND = Check(
    get="/v1/invoices/{invoice_id}",
    committed={"status": "sent", "id": "{invoice_id}"},
    not_executed={"status": "draft"},
)
REMIND = Check(
    get="/v1/invoices/{invoice_id}",
    committed={"reminders.0.count": "{count}", "flags.reminded": True},
    not_executed={"flags.reminded": False},
)


@pytest.fixture
def billing() -> Any:
    with FakeBilling() as fake:
        yield fake


def target(url: str) -> DeclarativeTarget:
    return DeclarativeTarget(url, (("billing.send_invoice", SEND), ("billing.remind", REMIND)))


def facts(action: str, arguments: dict[str, Any], **kw: Any) -> EffectFacts:
    return EffectFacts(
        effect_key=f"{action}:effect",
        action=action,
        arguments=arguments,
        **{"attempt_started_at": datetime.now(UTC), "clock": after_the_window, **kw},
    )


def after_the_window() -> datetime:
    """Asked once the attempt's settle window is over (``test_settle_window`` asks inside it)."""
    return datetime.now(UTC) + timedelta(minutes=10)


@pytest.mark.parametrize(
    ("invoice", "action", "arguments", "expected"),
    [
        ({"id": "in_1", "status": "sent"}, "billing.send_invoice", {}, "committed"),
        ({"id": "in_1", "status": "draft"}, "billing.send_invoice", {}, "not_executed"),
        ({"id": "in_1", "status": "void"}, "billing.send_invoice", {}, "unknown"),
        ({"id": "in_2", "status": "sent"}, "billing.send_invoice", {}, "unknown"),  # other id
        ({"status": "sent"}, "billing.send_invoice", {}, "unknown"),  # a path missing
        (None, "billing.send_invoice", {}, "unknown"),  # 404
        (
            {"id": "in_1", "reminders": [{"count": 2}], "flags": {"reminded": True}},
            "billing.remind",
            {"count": "2"},
            "committed",
        ),
        (
            {"id": "in_1", "reminders": [{"count": 2}], "flags": {"reminded": 1}},
            "billing.remind",
            {"count": 2},
            "unknown",
        ),
        ({"id": "in_1", "flags": {"reminded": False}}, "billing.remind", {}, "not_executed"),
        ({"id": "in_1", "status": "sent"}, "billing.create_invoice", {}, "unknown"),  # no spec
        ({"id": "in_1", "status": "sent"}, "billing.other", {}, "unknown"),
    ],
)
def test_answers(
    billing: FakeBilling,
    invoice: dict[str, Any] | None,
    action: str,
    arguments: dict[str, Any],
    expected: str,
) -> None:
    if invoice is not None:
        billing.invoices["in_1"] = invoice
    reconciler = DeclarativeReconciler.for_target(target(billing.url))
    answer = reconciler(facts(action, {"invoice_id": "in_1", **arguments}))
    assert answer == expected
    assert {m for m, _ in billing.requests} <= {"GET"}
    assert billing.writes_applied == 0


def test_path_values_are_quoted_and_missing_arguments_are_unknown(billing: FakeBilling) -> None:
    billing.invoices["in/1 x"] = {"id": "in/1 x", "status": "sent"}
    reconciler = DeclarativeReconciler.for_target(target(billing.url))
    assert reconciler(facts("billing.send_invoice", {"invoice_id": "in/1 x"})) == "committed"
    assert reconciler(facts("billing.send_invoice", {})) == "unknown"
    assert billing.requests == [("GET", "/v1/invoices/in/1 x")]


def test_the_request_authorization_is_forwarded(billing: FakeBilling) -> None:
    billing.invoices["in_1"] = {"id": "in_1", "status": "sent"}
    reconciler = DeclarativeReconciler.for_target(target(billing.url))
    credentials = {"Authorization": "Bearer billing-agent"}
    args = {"invoice_id": "in_1"}
    answer = reconciler(facts("billing.send_invoice", args, credentials=credentials))
    assert answer == "committed"
    assert billing.authorizations == ["Bearer billing-agent"]


@pytest.mark.parametrize("failure", ["500", "502", "unreachable", "timeout", "drop"])
def test_failures_are_unknown(billing: FakeBilling, closed_url: str, failure: str) -> None:
    billing.invoices["in_1"] = {"id": "in_1", "status": "sent"}
    billing.hang_seconds = 5
    if failure in ("timeout", "drop"):
        billing.fail_reads("hang" if failure == "timeout" else "drop")
    elif failure.isdigit():
        billing.fail_reads(int(failure))
    url = closed_url if failure == "unreachable" else billing.url
    reconciler = DeclarativeReconciler(url + "/", [("billing.send_invoice", SEND)], timeout=0.5)
    assert repr(reconciler) == f"DeclarativeReconciler({url!r})"
    began = time.monotonic()
    assert reconciler(facts("billing.send_invoice", {"invoice_id": "in_1"})) == "unknown"
    assert time.monotonic() - began < 3


@pytest.mark.parametrize(
    ("actual", "expected", "equal"),
    [
        ("sent", "sent", True),
        (2, "2", True),
        ("2", 2, True),
        (True, True, True),
        (True, 1, False),
        (1, True, False),
        (1.0, 1, False),
        (None, None, True),
        ([1], [1], True),
        ("Sent", "sent", False),
    ],
)
def test_same(actual: Any, expected: Any, equal: bool) -> None:
    assert same(actual, expected) is equal


@pytest.mark.parametrize(
    ("condition", "document", "arguments", "result"),
    [
        ({"a.b": 1}, {"a": {"b": 1}}, {}, True),
        ({"a.b": 1}, {"a": {"c": 1}}, {}, False),
        ({"a.1": "y"}, {"a": ["x", "y"]}, {}, True),
        ({"a.2": "y"}, {"a": ["x", "y"]}, {}, False),
        ({"a": "{x}"}, {"a": 5}, {"x": 5}, True),
        ({"a": "{x}"}, {"a": 5}, {}, False),
        ({"a": "{x} and more"}, {"a": "{x} and more"}, {"x": 5}, True),  # only "{name}" refers
        ({}, {"a": 1}, {}, False),  # an empty condition proves nothing
        ({"a": 1, "b": 2}, {"a": 1, "b": 3}, {}, False),
    ],
)
def test_holds(
    condition: dict[str, Any], document: Any, arguments: dict[str, Any], result: bool
) -> None:
    assert holds(condition, document, arguments) is result


def test_a_bad_get_template_is_refused() -> None:
    bad = Check(get="/v1/{not closed", committed={"a": 1}, not_executed={"a": 2})
    with pytest.raises(InvalidArgument, match=r"billing\.x"):
        DeclarativeReconciler("http://127.0.0.1:1", [("billing.x", bad)])


def test_settle_window(billing: FakeBilling) -> None:
    """A draft invoice while the send may still be in flight is no proof it was never sent."""
    billing.invoices["in_1"] = {"id": "in_1", "status": "draft"}
    reconciler = DeclarativeReconciler.for_target(replace(target(billing.url), timeout=5.0))
    started = datetime.now(UTC)
    at = [started + timedelta(seconds=5 + SETTLE_MARGIN - 1)]
    asked = facts(
        "billing.send_invoice",
        {"invoice_id": "in_1"},
        attempt_started_at=started,
        clock=lambda: at[0],
    )
    assert reconciler(asked) == "unknown"
    at[0] = started + timedelta(seconds=5 + SETTLE_MARGIN)
    assert reconciler(asked) == "not_executed"
    billing.invoices["in_1"]["status"] = "sent"  # committed needs no window
    at[0] = started
    assert reconciler(asked) == "committed"
