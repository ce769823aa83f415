"""The console's pure parts: hints, sessions, tokens, cookies, the listen address."""

from __future__ import annotations

import pytest

from ctrlrun.console import auth, hints, server
from ctrlrun.errors import InvalidArgument
from ctrlrun.operators import Operator


@pytest.mark.parametrize(
    ("action", "arguments", "key", "expected"),
    [
        (
            "stripe.refund",
            {"payment_intent": "pi_1", "payment_id": "pi_1", "amount": 500, "account": "self"},
            "ik_9",
            [
                "Idempotency-Key ik_9",
                "refund of 500 of pi_1",
                "GET /v1/refunds?payment_intent=pi_1",
            ],
        ),
        (
            "stripe.refund",
            {"charge": "ch_1", "payment_id": "ch_1", "account": "acct_7"},
            None,
            ["in account acct_7", "GET /v1/refunds?charge=ch_1", "at the time of the attempt"],
        ),
        (
            "stripe.cancel_payment_intent",
            {"payment_intent": "pi_2"},
            "ik",
            ["GET /v1/payment_intents/pi_2", "canceled"],
        ),
        ("stripe.payout", {"amount": 5}, "ik", ["GET /v1/events"]),
        (
            "k8s.scale",
            {"cluster": "prod-eu", "namespace": "shop", "deployment": "web", "replicas": 6},
            None,
            ["cluster prod-eu", "kubectl -n shop get deployment web", "Committed if it is 6"],
        ),
        (
            "k8s.scale",
            {"namespace": "db", "statefulset": "pg", "workload": "statefulset/pg", "replicas": 3},
            None,
            ["kubectl -n db get statefulset pg", "Committed if it is 3"],
        ),
        ("k8s.delete_namespace", {"cluster": "c", "name": "tmp"}, None, ["get namespace tmp"]),
        (
            "k8s.delete_deployment",
            {"cluster": "c", "namespace": "n", "deployment": "d"},
            None,
            ["kubectl -n n get deployment d"],
        ),
        (
            "k8s.update_deployment",
            {"namespace": "n", "workload": "deployment/web", "changes": ["images"]},
            None,
            ["get deployment/web -o yaml", "(images)"],
        ),
        ("billing.send", {"invoice": "in_1"}, None, ['{"invoice": "in_1"}', "billing.send"]),
    ],
)
def test_the_hint_names_what_to_look_up(
    action: str, arguments: dict[str, object], key: str | None, expected: list[str]
) -> None:
    said = hints.check_the_remote(action, arguments, idempotency_key=key, upstream="up")
    for part in expected:
        assert part in said, said
    assert "account self" not in said


def test_sessions_expire_and_are_replaced() -> None:
    now = [100.0]
    sessions = auth.Sessions(ttl=10, anonymous_ttl=2, clock=lambda: now[0])
    anon, alice = sessions.start(None), sessions.start("alice")
    assert anon.sid != alice.sid and anon.csrf != alice.csrf and len(alice.sid) >= 40
    assert sessions.get(anon.sid) is anon and sessions.get(alice.sid) is alice
    now[0] += 3
    assert sessions.get(anon.sid) is None and sessions.get(alice.sid) is alice
    now[0] += 8
    assert sessions.get(alice.sid) is None
    assert sessions.get(None) is None and sessions.get("") is None and sessions.get("x") is None
    bob = sessions.start("bob")
    sessions.end(bob.sid)
    assert sessions.get(bob.sid) is None


def test_csrf_and_tokens_compare_exactly() -> None:
    session = auth.Sessions().start("alice")
    assert session.csrf_ok(session.csrf)
    assert not session.csrf_ok(None) and not session.csrf_ok("") and not session.csrf_ok("x")
    assert not session.csrf_ok(session.csrf + "x") and not session.csrf_ok(session.csrf[:-1])
    tokens = {"alice": "a-token", "bob": "b-token"}
    assert auth.token_matches(tokens, "alice", "a-token")
    assert not auth.token_matches(tokens, "alice", "b-token")
    assert not auth.token_matches(tokens, "carol", "a-token")
    assert not auth.token_matches(tokens, "alice", "a-token ")


def test_tokens_are_read_from_the_environment() -> None:
    ops = {"alice": Operator("alice", "T_A"), "bob": Operator("bob", "T_B")}
    strong = "s3cr3t-0f-16-chrs"
    found, missing = auth.tokens_from_env(ops, {"T_A": strong, "T_B": ""})
    assert found == {"alice": strong} and missing == ["bob ($T_B)"]
    found, missing = auth.tokens_from_env(ops, {"T_A": strong[:15], "T_B": "x" * 16})
    assert found == {"alice": strong[:15], "bob": "x" * 16} and missing == []
    assert auth.weak(ops, found) == ["alice ($T_A)"]  # warned about at start, still a login


def test_the_cookie_and_reading_it_back() -> None:
    assert auth.cookie_header("s1", path="/s/p1", secure=False) == (
        "ctrlrun_console=s1; HttpOnly; SameSite=Strict; Path=/s/p1"
    )
    cleared = auth.cookie_header("s1", path="/login", secure=True, max_age=0)
    assert cleared.endswith("Path=/login; Max-Age=0; Secure")
    assert auth.session_ids(["ctrlrun_console=a; x=1; ctrlrun_console=b", "ctrlrun_console=c"]) == [
        "a",
        "b",
        "c",
    ]
    assert auth.session_id("a=1; ctrlrun_console=s2; b=3") == "s2"
    assert auth.session_id("other=1") is None and auth.session_id(None) is None
    assert auth.session_id("ctrlrun_console=") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [("127.0.0.1:9091", ("127.0.0.1", 9091)), ("[::1]:0", ("::1", 0)), ("h:1", ("h", 1))],
)
def test_listen_addresses(text: str, expected: tuple[str, int]) -> None:
    assert server.parse_listen(text) == expected


@pytest.mark.parametrize("text", ["9091", ":9091", "host:", "host:x", "host:70000"])
def test_bad_listen_addresses(text: str) -> None:
    with pytest.raises(InvalidArgument, match="HOST:PORT"):
        server.parse_listen(text)


def test_loopback_and_the_host_names_answered() -> None:
    assert server.is_loopback("127.0.0.1") and server.is_loopback("::1")
    assert server.is_loopback("localhost") and server.is_loopback("127.0.0.2")
    assert not server.is_loopback("10.0.0.1") and not server.is_loopback("console.internal")
    assert server.answers_to("0.0.0.0", 80) is None and server.answers_to("::", 80) is None
    names = server.answers_to("127.0.0.1", 9091)
    assert names == {"127.0.0.1:9091", "localhost:9091", "[::1]:9091"}
    assert server.answers_to("10.0.0.5", 9091) == {"10.0.0.5:9091"}


def test_a_flood_of_login_forms_never_drops_an_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "MAX_ANONYMOUS", 50)
    monkeypatch.setattr(auth, "MAX_OPERATOR_SESSIONS", 3)
    sessions = auth.Sessions()
    alice = sessions.start("alice")
    forms = [sessions.start(None) for _ in range(200)]
    assert sessions.get(alice.sid) is alice
    assert sessions.count() == (50, 1)
    assert sessions.get(forms[0].sid) is None and sessions.get(forms[-1].sid) is forms[-1]
    later = [sessions.start("bob") for _ in range(3)]
    assert sessions.count() == (50, 3)
    assert sessions.get(alice.sid) is None and all(sessions.get(s.sid) for s in later)
