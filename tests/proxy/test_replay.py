"""What a same-key retry's answer proves about the ambiguous attempt it repeats: the
evidence table of ``proxy/replay.py``, row by row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text

from ctrlrun import Control, EffectState, Policy, context, ledger, protect
from ctrlrun.action import Action, Principal
from ctrlrun.proxy.classify import Transport
from ctrlrun.proxy.forward import Forwarded
from ctrlrun.proxy.prepare import Prepared
from ctrlrun.proxy.replay import claim, evidence, inconclusive
from ctrlrun.store import SQLiteStateStore

IRE = "invalid_request_error"
REFUND_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: allow
"""
REPLAYED = (("Content-Type", "application/json"), ("Idempotent-Replayed", "true"))
FRESH = (("Content-Type", "application/json"),)


def stripe_error(kind: str, code: str | None, message: str = "m") -> bytes:
    return json.dumps({"error": {"type": kind, "code": code, "message": message}}).encode()


@pytest.mark.parametrize(
    ("reply", "found"),
    [
        # A 2xx: the effect exists now, exactly once (replayed, or run now because the first
        # attempt never reached Stripe's idempotency layer).
        (Forwarded(200, REPLAYED, b"{}"), "committed"),
        (Forwarded(200, FRESH, b"{}"), "committed"),
        # Stripe's stored answer to the first attempt was a refusal: it did nothing.
        (Forwarded(400, REPLAYED, stripe_error(IRE, "amount_too_large")), "not_executed"),
        (Forwarded(402, REPLAYED, stripe_error("card_error", "card_declined")), "not_executed"),
        (Forwarded(404, (("idempotent-replayed", " TRUE "),), b""), "not_executed"),
        # Answers given before the idempotency layer, or that cannot say: nothing proven.
        (Forwarded(401, FRESH, stripe_error(IRE, None)), "unknown"),
        (Forwarded(403, FRESH, b""), "unknown"),
        (Forwarded(409, FRESH, stripe_error(IRE, "idempotency_key_in_use")), "unknown"),
        (Forwarded(429, FRESH, stripe_error(IRE, "rate_limit")), "unknown"),
        (Forwarded(400, FRESH, stripe_error("idempotency_error", None)), "unknown"),
        (Forwarded(400, FRESH, stripe_error(IRE, "parameter_missing")), "unknown"),
        (Forwarded(404, FRESH, b""), "unknown"),
        (Forwarded(500, FRESH, b""), "unknown"),
        (Forwarded(500, REPLAYED, b""), "unknown"),  # a stored 500 stays a 500
        (Forwarded(408, REPLAYED, b""), "unknown"),
        (Forwarded(424, REPLAYED, b""), "unknown"),
        (Forwarded(302, FRESH, b""), "unknown"),
        (Forwarded(400, (("Idempotent-Replayed", "false"),), b""), "unknown"),
        (Forwarded(None, transport=Transport.SENT_NO_STATUS, error="reset"), "unknown"),
        (Forwarded(None, transport=Transport.NOT_SENT, error="refused"), "unknown"),
    ],
)
def test_evidence(reply: Forwarded, found: str) -> None:
    assert evidence(reply) == found


def prepared() -> Prepared:
    action = Action("stripe.refund", {"payment_id": "pi_1"}, Principal(agent="a"))
    return Prepared(action, "refund:pi_1", "idem-1", None, "0" * 64)


def test_inconclusive_names_the_status_and_error_kind_never_the_message() -> None:
    body = stripe_error(IRE, "api_key_invalid", "Invalid key sk_test_****1234")
    refusal = inconclusive(prepared(), Forwarded(401, FRESH, body), "refund:pi_1")
    assert (refusal.outcome, refusal.reason) == ("ambiguous", "replay_inconclusive")
    assert "HTTP 401 (invalid_request_error/api_key_invalid)" in refusal.message
    assert "sk_test" not in refusal.message
    assert refusal.effect_key == "refund:pi_1" and refusal.action == "stripe.refund"


@pytest.mark.parametrize("body", [b"", b"not json", b"[1]", b'{"error": 3}', b"\xff"])
def test_inconclusive_with_an_unreadable_body(body: bytes) -> None:
    refusal = inconclusive(prepared(), Forwarded(429, FRESH, body), "refund:pi_1")
    assert "HTTP 429 without" in refusal.message


def test_inconclusive_without_a_status() -> None:
    reply = Forwarded(None, transport=Transport.SENT_NO_STATUS, error="connection reset")
    assert "retry connection reset without" in inconclusive(prepared(), reply, "k").message


def test_a_replays_answer_settles_the_attempt_it_replayed_and_no_newer_one(
    tmp_path: Path,
) -> None:
    """A same-key retry of ambiguous attempt 1 is forwarded; meanwhile a reconcile renews the
    key and attempt 2 acts and ends ambiguous. The retry's answer, Stripe's stored answer to
    attempt 1, says nothing about attempt 2: it must not move it."""
    store = SQLiteStateStore(tmp_path / "state.db")
    ctl = Control(Policy.from_yaml(REFUND_POLICY), store)
    lost = protect("stripe.refund", control=ctl)(_reply_lost)
    renewing = protect("stripe.refund", control=ctl, reconcile=lambda key: "not_executed")(
        _reply_lost
    )
    with context("a"):
        with pytest.raises(ConnectionError):
            lost("pi_1")  # attempt 1: ambiguous
        with store.transaction() as conn:  # as the proxy records it: with the client's key
            conn.execute(text("UPDATE effects SET idempotency_key = 'idem-1'"))
        with store.reading() as conn:
            first = ledger.get_effect(conn, "refund:pi_1")
        claimed = claim(ctl, prepared())  # the same refund, with the same Idempotency-Key
        assert first is not None and claimed is not None
        assert claimed.about == (first.action_id, 1)
        with pytest.raises(ConnectionError):
            renewing("pi_1")  # attempt 2: renewed on "not_executed", acted, ambiguous
    ctl.reconciler.settle(claimed.effect_key, "committed", about=claimed.about)
    with store.reading() as conn:
        now = ledger.get_effect(conn, "refund:pi_1")
    assert now is not None and (now.state, now.attempt) == (EffectState.AMBIGUOUS, 2)
    store.close()


def _reply_lost(payment_id: str) -> None:
    raise ConnectionError("reply lost")  # the remote acted; nobody heard
