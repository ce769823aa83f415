"""Which payment a refund names, asked of a charges API on loopback: every answer that is not
a clear one refuses the refund (nothing forwarded), and the question carries only the request's
own credentials and account."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from ctrlrun.policy import Policy
from ctrlrun.proxy.config import Upstream
from ctrlrun.proxy.forward import Forwarder
from ctrlrun.proxy.refusals import Refusal
from ctrlrun.proxy.routes import Mapped, Request
from ctrlrun.proxy.stripe_payments import reads, resolve
from ctrlrun.testing import FakeServer, Response
from ctrlrun.testing import Request as Received

READS_AMOUNT = Policy.from_yaml(
    """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    rules:
      - when: {reason_eq: fraudulent}
        decision: deny
      - when: {amount_gt: 1000}
        decision: deny
      - decision: allow
  stripe.payout:
    decision: allow
"""
)
IGNORES_AMOUNT = Policy.from_yaml(
    "schema: ctrlrun.policy/v2\nactions:\n  stripe.refund:\n    decision: allow\n"
)


class Charges(FakeServer):
    """``GET /v1/charges/{id}`` answers what the test put there; every request is kept."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: dict[str, Response] = {}
        self.seen: list[Received] = []

    def handle(self, request: Received) -> Response:
        self.seen.append(request)
        return self.answers.get(request.path, Response.json(404, {"error": {"type": "x"}}))

    def error_response(
        self, request: Received, status: int, *, applied: Response | None
    ) -> Response:
        return Response.json(status, {"error": {"type": "api_error"}})


@pytest.fixture
def charges() -> Iterator[Charges]:
    with Charges() as server:
        yield server


def upstream(server: FakeServer) -> Upstream:
    return Upstream(
        name="stripe", profile="stripe", url=server.url, scheme="http",
        host=server.host, port=server.port, timeout=5,
    )  # fmt: skip


def ask(server: Charges, arguments: dict[str, Any], policy: Policy = READS_AMOUNT) -> Any:
    up = upstream(server)
    headers = {
        "authorization": "Bearer sk_test_mine",
        "stripe-account": "acct_9",
        "cookie": "secret=1",
        "content-type": "application/x-www-form-urlencoded",
    }
    request = Request("POST", "/v1/refunds", {}, headers, b"")

    async def run() -> Any:
        forwarder = Forwarder([up])
        try:
            return await resolve(forwarder, up, request, Mapped("stripe.refund", arguments), policy)
        finally:
            await forwarder.aclose()

    return asyncio.run(run())


def test_reads() -> None:
    assert reads(READS_AMOUNT, "stripe.refund", "amount")
    assert reads(READS_AMOUNT, "stripe.refund", "reason")
    assert not reads(READS_AMOUNT, "stripe.payout", "amount")
    assert not reads(READS_AMOUNT, "stripe.nothing", "amount")
    assert not reads(IGNORES_AMOUNT, "stripe.refund", "amount")


def test_a_charge_is_named_by_its_payment_intent(charges: Charges) -> None:
    charges.answers["/v1/charges/ch_1"] = Response.json(
        200, {"id": "ch_1", "payment_intent": "pi_1"}
    )

    got = ask(charges, {"charge": "ch_1", "amount": 5, "payment_id": "ch_1"})

    assert got == Mapped("stripe.refund", {"charge": "ch_1", "amount": 5, "payment_id": "pi_1"})
    [seen] = charges.seen
    assert (seen.method, seen.path, seen.body) == ("GET", "/v1/charges/ch_1", b"")
    assert seen.header("authorization") == "Bearer sk_test_mine"
    assert seen.header("stripe-account") == "acct_9" and seen.header("cookie") == ""


def test_a_charge_of_its_own_is_its_own_payment(charges: Charges) -> None:
    charges.answers["/v1/charges/ch_2"] = Response.json(200, {"id": "ch_2", "payment_intent": None})
    got = ask(charges, {"charge": "ch_2", "amount": 5, "payment_id": "ch_2"})
    assert isinstance(got, Mapped) and got.arguments["payment_id"] == "ch_2"


def test_a_payment_intent_needs_no_question(charges: Charges) -> None:
    args = {"payment_intent": "pi_3", "amount": 5, "payment_id": "pi_3"}
    assert ask(charges, args) == Mapped("stripe.refund", args)
    assert charges.seen == []


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        (Response.json(200, {"id": "ch_1", "payment_intent": 7}), "unavailable"),
        (Response.json(200, {"id": "ch_1", "payment_intent": ""}), "unavailable"),
        (Response.json(200, {"id": "ch_1", "payment_intent": {"id": "pi_1"}}), "unavailable"),
        (Response.json(200, {"id": "ch_other", "payment_intent": "pi_1"}), "unavailable"),
        (Response.json(200, {"payment_intent": "pi_1"}), "unavailable"),
        (Response(200, b"not json", {}), "unavailable"),
        (Response.json(200, ["pi_1"]), "unavailable"),
        (Response.json(500, {}), "unavailable"),
        (Response.json(503, {}), "unavailable"),
        (Response.json(401, {}), "invalid_request"),
        (Response.json(404, {}), "invalid_request"),
        (Response.json(302, {}), "invalid_request"),
    ],
)
def test_an_unclear_answer_refuses_the_refund(
    charges: Charges, answer: Response, outcome: str
) -> None:
    charges.answers["/v1/charges/ch_1"] = answer
    got = ask(charges, {"charge": "ch_1", "amount": 5, "payment_id": "ch_1"})
    assert isinstance(got, Refusal) and (got.outcome, got.reason) == (outcome, "payment_unresolved")


def test_no_answer_at_all_refuses_the_refund(charges: Charges) -> None:
    charges.fail_reads("drop")
    got = ask(charges, {"charge": "ch_1", "amount": 5, "payment_id": "ch_1"})
    assert isinstance(got, Refusal) and got.outcome == "unavailable"


def test_an_id_is_quoted_into_one_path_segment(charges: Charges) -> None:
    ask(charges, {"charge": "ch_1/../../v1/refunds", "amount": 5})
    [seen] = charges.seen
    assert seen.target == "/v1/charges/ch_1%2F..%2F..%2Fv1%2Frefunds"


def test_no_amount_is_refused_only_where_rules_read_it(charges: Charges) -> None:
    charges.answers["/v1/charges/ch_1"] = Response.json(
        200, {"id": "ch_1", "payment_intent": "pi_1"}
    )
    refused = ask(charges, {"charge": "ch_1", "payment_id": "ch_1"})
    assert isinstance(refused, Refusal) and refused.reason == "amount_required"
    assert charges.seen == []  # decided before anything is asked
    allowed = ask(charges, {"charge": "ch_1", "payment_id": "ch_1"}, IGNORES_AMOUNT)
    assert isinstance(allowed, Mapped) and allowed.arguments["payment_id"] == "pi_1"
