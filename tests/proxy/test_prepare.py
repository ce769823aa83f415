"""The pure steps of the protected path: screen, prepare, the headers forwarded, the verdict
after forwarding, and what makes a same-key retry a replay."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest

from ctrlrun.action import Action, Principal, iso, utc_now
from ctrlrun.errors import EffectKeyError
from ctrlrun.policy import Policy
from ctrlrun.proxy import settle
from ctrlrun.proxy.classify import Transport
from ctrlrun.proxy.config import Upstream
from ctrlrun.proxy.forward import Forwarded
from ctrlrun.proxy.prepare import (
    Prepared,
    Screened,
    Unresolvable,
    prepare,
    screen,
    upstream_headers,
)
from ctrlrun.proxy.refusals import Refusal
from ctrlrun.proxy.replay import REPLAY_WINDOW, replayable
from ctrlrun.proxy.routes import Invalid, Mapped, Request, Unmapped

AGENT = Principal("agent-1")
POLICY = Policy.from_yaml(
    """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: allow
  stripe.payout:
    decision: allow
"""
)
STRIPE = Upstream("stripe", "stripe", "http://s:1", "http", "s", 1)
KUBE = Upstream("kube", "kubernetes", "http://k:1", "http", "k", 1)
OPEN = Upstream("open", "http", "http://o:1", "http", "o", 1, unmapped_writes="allow")
REFUND = Mapped("stripe.refund", {"payment_id": "pi_1", "amount": 100})
HEADERS = {
    "authorization": "Bearer sk_test_1",
    "stripe-account": "acct_1",
    "idempotency-key": "idem-1",
    "ctrlrun-approval": "apr_1",
    "cookie": "c=1",
    "proxy-authorization": "Basic eA==",
}


def request(body: bytes = b"amount=100", headers: dict[str, str] | None = None) -> Request:
    return Request(
        "POST", "/v1/refunds", headers=HEADERS if headers is None else headers, body=body
    )


# -- screen --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("up", "mapped", "principal", "outcome", "reason"),
    [
        (STRIPE, Invalid("a float amount"), AGENT, "invalid_request", "a float amount"),
        (STRIPE, Invalid("a float amount"), None, "invalid_request", "a float amount"),
        (STRIPE, REFUND, None, "denied", "no_principal"),
        (STRIPE, Unmapped("no route"), AGENT, "denied", "unmapped_write"),
    ],
)
def test_screen_refuses(
    up: Upstream,
    mapped: Mapped | Unmapped | Invalid,
    principal: Principal | None,
    outcome: str,
    reason: str,
) -> None:
    refusal = screen(up, request(), mapped, principal)
    assert isinstance(refusal, Refusal)
    assert (refusal.outcome, refusal.reason) == (outcome, reason)


@pytest.mark.parametrize(("up", "mapped"), [(STRIPE, REFUND), (OPEN, Unmapped("no route"))])
def test_screen_lets_through(up: Upstream, mapped: Mapped | Unmapped) -> None:
    assert screen(up, request(), mapped, AGENT) == Screened(mapped, AGENT)


# -- prepare -------------------------------------------------------------------------------


def test_prepare_gathers_what_later_steps_need() -> None:
    body = b"payment_intent=pi_1&amount=100"
    got = prepare(STRIPE, request(body), REFUND, AGENT, POLICY, "production")

    assert isinstance(got, Prepared)
    assert (got.action.name, got.action.principal, got.effect_key) == (
        "stripe.refund",
        AGENT,
        "refund:pi_1",
    )
    assert (got.idempotency_key, got.approval_id) == ("idem-1", "apr_1")
    assert got.digest == hashlib.sha256(body).hexdigest()
    # Only what a reconciler may ask with; never cookies or the proxy credential.
    assert dict(got.credentials) == {
        "authorization": "Bearer sk_test_1",
        "stripe-account": "acct_1",
    }
    assert "sk_test_1" not in repr(got)


def test_the_idempotency_key_is_read_for_stripe_only() -> None:
    mapped = Mapped("stripe.refund", {"payment_id": "pi_1"})
    got = prepare(KUBE, request(), mapped, AGENT, POLICY, "production")
    assert isinstance(got, Prepared) and got.idempotency_key is None


def test_an_action_without_an_effect_template_has_no_key() -> None:
    got = prepare(STRIPE, request(), Mapped("stripe.payout", {"amount": 1}), AGENT, POLICY, "x")
    assert isinstance(got, Prepared) and got.effect_key is None


def test_an_unresolvable_key_is_returned_for_its_receipt() -> None:
    got = prepare(STRIPE, request(), Mapped("stripe.refund", {"amount": 1}), AGENT, POLICY, "x")
    assert isinstance(got, Unresolvable)
    assert isinstance(got.error, EffectKeyError) and got.action.name == "stripe.refund"


def test_arguments_the_kernel_cannot_accept_are_an_invalid_request() -> None:
    got = prepare(STRIPE, request(), Mapped("stripe.refund", {"amount": 1.5}), AGENT, POLICY, "x")
    assert isinstance(got, Refusal)
    assert (got.outcome, got.reason, got.action) == (
        "invalid_request",
        "invalid_argument",
        "stripe.refund",
    )


@pytest.mark.parametrize(
    ("up", "client_key", "token", "sent"),
    [
        (STRIPE, None, "tok_1", "tok_1"),  # no key of its own: the attempt's
        (STRIPE, "idem-1", "tok_1", "idem-1"),  # the client's own key, untouched
        (STRIPE, None, None, None),  # no effect key, no token: nothing invented
        (KUBE, None, "tok_1", None),  # only Stripe reads the header
    ],
)
def test_upstream_headers(
    up: Upstream, client_key: str | None, token: str | None, sent: str | None
) -> None:
    raw = [
        ("Ctrlrun-Approval", "apr_1"),
        ("Proxy-Authorization", "Basic x"),
        ("Authorization", "B"),
    ]
    if client_key:
        raw.append(("Idempotency-Key", client_key))
    headers = {k.lower(): v for k, v in raw}
    got = prepare(up, request(headers=headers), REFUND, AGENT, POLICY, "production")
    assert isinstance(got, Prepared)

    out = upstream_headers(up, got, raw, token)

    assert [v for k, v in out if k.lower() == "idempotency-key"] == ([sent] if sent else [])
    assert {k.lower() for k, _ in out} <= {"authorization", "idempotency-key"}


# -- settle: what the agent is told after forwarding ---------------------------------------

PREPARED = prepare(STRIPE, request(), REFUND, AGENT, POLICY, "production")
assert isinstance(PREPARED, Prepared)
OK = Forwarded(200, (("content-type", "application/json"),), b"{}")
CUT = Forwarded(200, (), b"", error="IncompleteReadError: cut", cut_short=True)
REFUSED = Forwarded(None, transport=Transport.NOT_SENT, error="ConnectError: refused")
SILENT = Forwarded(None, transport=Transport.SENT_NO_STATUS, error="ReadTimeout")
FIVE = Forwarded(500, (), b"oops")


@pytest.mark.parametrize(
    ("reply", "outcome", "found", "expected"),
    [
        (OK, "committed", None, None),  # the remote's own answer
        (Forwarded(402, (), b"{}"), "failed", None, None),
        (REFUSED, "failed", None, ("unavailable", "upstream_unreachable")),
        (SILENT, "ambiguous", "committed", ("upstream_ambiguous", "reconciler: committed")),
        (FIVE, "ambiguous", None, ("upstream_ambiguous", "reconciler: not asked")),
        (CUT, "committed", "not asked", ("upstream_ambiguous", "reconciler: not asked")),
    ],
)
def test_verdict(
    reply: Forwarded, outcome: str, found: str | None, expected: tuple[str, str] | None
) -> None:
    got = settle.verdict(PREPARED, reply, outcome, "ctr_1", found)  # type: ignore[arg-type]
    if expected is None:
        assert got is reply
        return
    assert isinstance(got, Refusal)
    assert (got.outcome, got.reason, got.receipt_id) == (*expected, "ctr_1")
    assert (got.action, got.effect_key) == ("stripe.refund", "refund:pi_1")


def test_the_record_keeps_the_transport_line_or_the_status() -> None:
    assert settle.record_error(OK, "committed") is None
    assert settle.record_error(FIVE, "ambiguous") == "HTTP 500"
    assert settle.record_error(REFUSED, "failed") == "ConnectError: refused"


def test_only_a_lost_reply_asks_the_reconciler() -> None:
    assert [settle.lost(r, o) for r, o in [(OK, "committed"), (REFUSED, "failed")]] == [False] * 2
    assert [settle.lost(r, o) for r, o in [(SILENT, "ambiguous"), (CUT, "committed")]] == [True] * 2


# -- replay: which same-key retry is the client's own -------------------------------------


def row(**changes: object) -> dict[str, object]:
    action = Action("stripe.refund", {"payment_id": "pi_1", "amount": 100}, AGENT)
    base: dict[str, object] = {
        "state": "ambiguous",
        "idempotency_key": "idem-1",
        "updated_at": iso(utc_now() - timedelta(minutes=5)),
        "action_json": action.canonical.decode("utf-8"),
    }
    return base | changes


SAME = Action("stripe.refund", {"payment_id": "pi_1", "amount": 100}, AGENT)


@pytest.mark.parametrize(
    ("record", "replays"),
    [
        (row(), True),
        (None, False),
        (row(state="committed"), False),
        (row(state="executing"), False),
        (row(idempotency_key="idem-other"), False),
        (row(idempotency_key=None), False),
        (row(updated_at=iso(utc_now() - REPLAY_WINDOW - timedelta(minutes=1))), False),
        (
            row(
                action_json=Action(
                    "stripe.refund", {"payment_id": "pi_1", "amount": 200}, AGENT
                ).canonical.decode()
            ),
            False,
        ),
    ],
)
def test_replayable(record: dict[str, object] | None, replays: bool) -> None:
    assert replayable(record, SAME, "idem-1", utc_now()) is replays


def test_prepare_applies_the_policy_resource_template() -> None:
    policy = Policy.from_yaml(
        """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{resource}"
    resource: "payment:{payment_id}"
    decision: allow
"""
    )
    got = prepare(STRIPE, request(), REFUND, AGENT, policy, "production")
    assert isinstance(got, Prepared)
    assert got.action.resource == "payment:pi_1" and got.effect_key == "refund:payment:pi_1"
    missing = Mapped("stripe.refund", {"charge": "ch_1", "amount": 100})
    refused = prepare(STRIPE, request(), missing, AGENT, policy, "production")
    assert isinstance(refused, Refusal) and refused.outcome == "invalid_request"
