"""The console over HTTP: a real server on 127.0.0.1, a real SQLite ledger, httpx as the
browser. What is refused changes nothing; what is done is recorded under the operator."""

from __future__ import annotations

import json
import logging
import os
import ssl
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from console_support import (
    ENV,
    POLICY,
    TOKENS,
    Ledger,
    client,
    csrf_of,
    login,
    new_ledger,
    postgres_database,
    prefix_of,
    running,
    self_signed,
)
from sqlalchemy import select

import ctrlrun
from ctrlrun import ledger as L
from ctrlrun.console import ConsoleSettings, board, build
from ctrlrun.errors import InvalidArgument, PolicyError
from ctrlrun.freeze import list_freezes
from ctrlrun.receipts import load_receipts
from ctrlrun.schema import events

pytestmark = pytest.mark.timeout(60)
PAGES = ["/approvals", "/ambiguous", "/receipts", "/freeze"]


@pytest.fixture
def lg(tmp_path: Path) -> Ledger:
    return new_ledger(tmp_path)


def approval(lg: Ledger, request_id: str) -> dict[str, object]:
    store = lg.store()
    try:
        with store.reading() as conn:
            row = L.approval_row(conn, request_id)
        assert row is not None
        return dict(row)
    finally:
        store.close()


def effect_state(lg: Ledger, key: str) -> str:
    store = lg.store()
    try:
        with store.reading() as conn:
            rec = L.get_effect(conn, key)
        assert rec is not None
        return rec.state.value
    finally:
        store.close()


def resolved_events(lg: Ledger, key: str) -> list[dict[str, object]]:
    store = lg.store()
    try:
        with store.reading() as conn:
            rows = conn.execute(select(events).where(events.c.effect_key == key))
            return [
                json.loads(r._mapping["data_json"])
                for r in rows
                if r._mapping["type"] == "EFFECT_RESOLVED"
            ]
    finally:
        store.close()


def freezes_and_receipts(lg: Ledger) -> tuple[list[object], list[dict[str, object]]]:
    store = lg.store()
    try:
        with store.reading() as conn:
            return list(list_freezes(conn)), [r.to_dict() for r in load_receipts(conn)]
    finally:
        store.close()


def test_no_page_is_served_without_a_login(lg: Ledger) -> None:
    request_id = lg.ask_approval("pi_secret1")
    with running(lg) as server, client(server) as c:
        for path in ["/", *PAGES, "/nowhere", "/approvals?x=1"]:
            got = c.get(path)
            assert got.status_code == 303, path
            assert got.headers["location"] in ("/login", f"/login?next={path}"), path
            assert request_id not in got.text
        for path in ["/approvals/answer", "/freeze", "/ambiguous/settle", "/logout"]:
            c.cookies.clear()
            got = c.post(path, data={"request_id": request_id, "decision": "approve"})
            assert got.status_code == 401 and request_id not in got.text, path
        login_page = c.get("/login")
        assert login_page.status_code == 200 and request_id not in login_page.text
        assert 'id="login"' in login_page.text
    assert approval(lg, request_id)["status"] == "pending"


@pytest.mark.parametrize(
    ("name", "token"),
    [
        ("alice", "wrong-token"),
        ("alice", TOKENS["bob"]),  # bob's token does not make anyone alice
        ("mallory", TOKENS["alice"]),
        ("alice", ""),
    ],
)
def test_a_wrong_token_is_refused(lg: Ledger, name: str, token: str) -> None:
    with running(lg) as server, client(server) as c:
        form = c.get("/login")
        got = c.post("/login", data={"csrf": csrf_of(form.text), "operator": name, "token": token})
        assert got.status_code == 401
        assert "Wrong operator or token." in got.text
        assert c.get("/approvals").status_code == 303  # still not logged in


def test_the_session_cookie_and_the_security_headers(lg: Ledger) -> None:
    with running(lg) as server, client(server) as c:
        form = c.get("/login")
        before = form.headers["set-cookie"]
        done = c.post(
            "/login",
            data={"csrf": csrf_of(form.text), "operator": "alice", "token": TOKENS["alice"]},
        )
        cookie = done.headers.get_list("set-cookie")[0]
        flags = [part.strip() for part in cookie.split(";")]
        assert flags[0].startswith("ctrlrun_console=") and len(flags[0]) > 50
        base = done.headers["location"].removesuffix("/approvals")  # the session's own path
        assert {"HttpOnly", "SameSite=Strict", f"Path={base}"} <= set(flags[1:])
        assert base.startswith("/s/") and len(base) > 40
        assert "Path=/login" in before  # the login form's cookie: only for the login form
        assert "Secure" not in flags  # plain HTTP on loopback: a Secure cookie would never return
        assert flags[0] != before.split(";")[0]  # a new session id at login
        for path in ["/login", *PAGES, "/console.css"]:
            got = c.get(base + path)
            assert got.status_code == (303 if path == "/login" else 200), path
            csp = got.headers["content-security-policy"]
            assert "default-src 'self'" in csp and "script-src 'none'" in csp
            assert got.headers["x-frame-options"] == "DENY"
            assert got.headers["referrer-policy"] == "no-referrer"
            assert got.headers["cache-control"] == "no-store"
            assert "<script" not in got.text


def test_forged_posts_are_refused_and_change_nothing(lg: Ledger) -> None:
    request_id = lg.ask_approval("pi_forged1")
    key = lg.make_ambiguous(1)
    with running(lg) as server, client(server) as c:
        csrf = login(c)
        own = server.url
        forged = [
            ({}, {}),  # no token
            ({"csrf": "not-the-token"}, {}),
            ({"csrf": csrf}, {"Origin": "http://evil.example"}),
            ({"csrf": csrf}, {"Origin": own.replace("127.0.0.1", "localhost")}),
            ({"csrf": csrf}, {"Sec-Fetch-Site": "cross-site"}),
        ]
        for token, headers in forged:
            for path, data in [
                ("/approvals/answer", {"request_id": request_id, "decision": "approve"}),
                ("/ambiguous/settle", {"effect_key": key, "state": "failed", "note": "x"}),
                ("/freeze", {"action": "", "reason": "forged"}),
            ]:
                got = c.post(path, data={**data, **token}, headers=headers)
                assert got.status_code == 403, (path, token, headers)
                assert "Nothing was changed" in got.text
        assert c.post("/logout", data={}).status_code == 403
        assert c.get("/approvals").status_code == 200  # the session survived the forged logout
    assert approval(lg, request_id)["status"] == "pending"
    assert effect_state(lg, key) == "ambiguous"
    assert freezes_and_receipts(lg)[0] == []


def test_approve_and_deny_are_recorded_under_the_operator(lg: Ledger) -> None:
    first, second = lg.ask_approval("pi_one"), lg.ask_approval("pi_two")
    with running(lg) as server, client(server) as alice, client(server) as bob:
        page = alice.get("/login")
        assert page.status_code == 200
        csrf_a, csrf_b = login(alice), login(bob, "bob")
        listed = alice.get("/approvals").text
        assert first in listed and second in listed and "pi_one" in listed
        assert "refund-bot" in listed
        done = alice.post(
            "/approvals/answer", data={"csrf": csrf_a, "request_id": first, "decision": "approve"}
        )
        assert done.status_code == 303
        assert done.headers["location"] == prefix_of(alice) + "/approvals"
        assert f"granted {first} by alice" in alice.get("/approvals").text
        denied = bob.post(
            "/approvals/answer", data={"csrf": csrf_b, "request_id": second, "decision": "deny"}
        )
        assert denied.status_code == 303
        again = alice.post(
            "/approvals/answer", data={"csrf": csrf_a, "request_id": first, "decision": "approve"}
        )
        assert again.status_code == 409 and "granted, not pending" in again.text
        unknown = alice.post(
            "/approvals/answer",
            data={"csrf": csrf_a, "request_id": "apr_nosuchrequest", "decision": "approve"},
        )
        assert unknown.status_code == 409
        assert "no approval request apr_nosuchrequest" in unknown.text
        assert "Traceback" not in unknown.text
    assert (approval(lg, first)["status"], approval(lg, first)["approver"]) == ("granted", "alice")
    assert (approval(lg, second)["status"], approval(lg, second)["approver"]) == ("denied", "bob")

    @ctrlrun.protect("stripe.refund", control=lg.control)
    def refund(payment_id: str, amount: int) -> str:
        return "refunded"

    with ctrlrun.context(agent="refund-bot"), ctrlrun.with_approval(first):
        assert refund(payment_id="pi_one", amount=5000) == "refunded"
    (receipt,) = [r for r in freezes_and_receipts(lg)[1] if r["result"] == "committed"]
    assert (receipt["approval_id"], receipt["approver"]) == (first, "alice")


def test_settling_an_ambiguous_effect_needs_a_note_and_records_it(lg: Ledger) -> None:
    key, other = lg.make_ambiguous(7), lg.make_ambiguous(8)
    with running(lg) as server, client(server) as c:
        csrf = login(c)
        page = c.get("/ambiguous").text
        assert key in page and other in page and "Check the remote" in page
        for note in ["", "   "]:
            got = c.post(
                "/ambiguous/settle",
                data={"csrf": csrf, "effect_key": key, "state": "failed", "note": note},
            )
            assert got.status_code == 400 and "a note is required" in got.text
        assert effect_state(lg, key) == "ambiguous"
        done = c.post(
            "/ambiguous/settle",
            data={
                "csrf": csrf,
                "effect_key": key,
                "state": "committed",
                "note": "push 7 is in the remote's log at 12:03",
            },
        )
        assert done.status_code == 303
        assert f"{key} settled committed by alice" in c.get("/ambiguous").text
        twice = c.post(
            "/ambiguous/settle",
            data={"csrf": csrf, "effect_key": key, "state": "failed", "note": "again"},
        )
        assert twice.status_code == 409 and "is not ambiguous (it is committed)" in twice.text
        bad = c.post(
            "/ambiguous/settle",
            data={"csrf": csrf, "effect_key": other, "state": "maybe", "note": "x"},
        )
        assert bad.status_code == 400
    assert effect_state(lg, key) == "committed" and effect_state(lg, other) == "ambiguous"
    (event,) = resolved_events(lg, key)
    assert event["resolver"] == "alice" and event["resolved_by"] == "human"
    assert event["note"] == "push 7 is in the remote's log at 12:03"


def test_freeze_and_unfreeze_are_receipts_of_the_operator(lg: Ledger) -> None:
    with running(lg) as server, client(server) as c:
        csrf = login(c, "bob")
        none = c.post("/freeze", data={"csrf": csrf, "action": "", "reason": "  "})
        assert none.status_code == 400 and "a freeze needs a reason" in none.text
        done = c.post(
            "/freeze", data={"csrf": csrf, "action": "stripe.refund", "reason": "refund loop"}
        )
        assert done.status_code == 303
        page = c.get("/freeze").text
        assert "stripe.refund is frozen by bob: refund loop" in page
        frozen, _ = freezes_and_receipts(lg)
        assert [(f.scope, f.frozen_by) for f in frozen] == [("stripe.refund", "bob")]  # type: ignore[attr-defined]
        with pytest.raises(ctrlrun.ActionDenied, match="refund loop"):
            lg.ask_approval("pi_frozen")
        lifted = c.post("/unfreeze", data={"csrf": csrf, "scope": "stripe.refund"})
        assert lifted.status_code == 303
        assert "unfrozen: stripe.refund by bob" in c.get("/freeze").text
    frozen, receipts = freezes_and_receipts(lg)
    assert frozen == []
    acts = [(r["action"], r["approver"]) for r in receipts if r["action"].startswith("ctrlrun.")]
    assert acts == [("ctrlrun.freeze", "bob"), ("ctrlrun.unfreeze", "bob")]


def test_receipts_page_shows_the_chain(lg: Ledger) -> None:
    lg.make_ambiguous(3)
    with running(lg) as server, client(server) as c:
        login(c)
        page = c.get("/receipts").text
        assert 'id="receipts"' in page and "Chain intact: 1 receipts" in page
        assert "push:3" in page and "ops.push" in page


def test_receipts_page_walks_only_the_newest(lg: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    lg.make_ambiguous(3)
    lg.make_ambiguous(4)
    monkeypatch.setattr(board, "CHAIN_WALK", 1)  # the page's time must not grow with the ledger
    with running(lg) as server, client(server) as c:
        login(c)
        page = c.get("/receipts").text
    assert "Chain intact: 1 receipts (the newest, from seq 2" in page
    assert "ctrlrun receipts --verify-chain</code> walks them all" in page


def test_values_are_escaped(tmp_path: Path) -> None:
    lg = new_ledger(tmp_path)
    lg.ask_approval("<script>alert(1)</script>")
    with running(lg) as server, client(server) as c:
        login(c)
        page = c.get("/approvals").text
        assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_an_expired_session_says_so_and_logout_ends_one(lg: Ledger) -> None:
    request_id = lg.ask_approval("pi_late")
    with running(lg, session_ttl=0.5) as server, client(server) as c:
        csrf = login(c)
        time.sleep(0.7)
        late = c.post(
            "/approvals/answer", data={"csrf": csrf, "request_id": request_id, "decision": "deny"}
        )
        assert late.status_code == 401 and "Your session has expired" in late.text
        c.cookies.clear()
        login(c)
        time.sleep(0.7)
        got = c.get("/approvals")
        assert got.status_code == 303 and got.headers["location"] == "/login?expired"
        assert "Your session has expired" in c.get(server.url + "/login?expired").text
        csrf = login(c)
        assert c.post("/logout", data={"csrf": csrf}).status_code == 303
        assert c.get("/approvals").status_code == 303
    assert approval(lg, request_id)["status"] == "pending"


def test_another_host_name_is_not_answered(lg: Ledger) -> None:
    with running(lg) as server:
        port = server.url.rsplit(":", 1)[1]
        got = httpx.get(server.url + "/login", headers={"Host": f"rebound.example:{port}"})
        assert got.status_code == 421
        assert httpx.get(f"http://localhost:{port}/login", trust_env=False).status_code == 200


def test_a_failure_is_a_page_and_a_log_line_without_secrets(
    lg: Ledger, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from ctrlrun.console import board

    with running(lg) as server, client(server) as c:
        login(c)

        def broken(conn: object) -> None:
            raise RuntimeError(f"boom {TOKENS['alice']}")

        monkeypatch.setattr(board, "counts", broken)
        with caplog.at_level(logging.INFO, logger="ctrlrun.console"):
            got = c.get("/approvals")
        assert got.status_code == 500 and "The console failed" in got.text
        assert "Traceback" not in got.text and TOKENS["alice"] not in got.text
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "RuntimeError" in logged
    sid = c.cookies.get("ctrlrun_console")
    assert TOKENS["alice"] not in logged and sid and sid not in logged


def test_start_up_refusals(tmp_path: Path) -> None:
    bare = new_ledger(tmp_path / "a", "schema: ctrlrun.policy/v2\nactions: {}\n")
    with pytest.raises(PolicyError, match="add an `operators:` section"):
        build(ConsoleSettings(listen="127.0.0.1:0", store_url=bare.url, policy=str(bare.policy)))
    lg = new_ledger(tmp_path / "b")
    with pytest.raises(PolicyError, match="no operator can log in"):
        build(ConsoleSettings(listen="127.0.0.1:0", store_url=lg.url, policy=str(lg.policy)), {})
    with pytest.raises(InvalidArgument, match="--allow-remote"):
        build(ConsoleSettings(listen="0.0.0.0:0", store_url=lg.url, policy=str(lg.policy)), {})


def test_the_command_refuses_in_one_line_and_teaches(tmp_path: Path) -> None:
    bare = new_ledger(tmp_path, "schema: ctrlrun.policy/v2\nactions: {}\n")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ctrlrun.cli", "console", *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )

    refused = run("--policy", str(bare.policy), "--store-url", bare.url)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "operators:" in refused.stderr
    remote = run("--listen", "0.0.0.0:9091", "--policy", str(bare.policy))
    assert remote.returncode == 2 and "--allow-remote" in remote.stderr
    helped = run("--help")
    assert helped.returncode == 0 and "Example" in helped.stdout and "operators:" in helped.stdout


def test_a_refusal_is_one_line_even_with_an_operator_left_without_a_token(
    tmp_path: Path,
) -> None:
    lg = new_ledger(tmp_path)
    env = {**os.environ, "CONSOLE_ALICE": TOKENS["alice"]}
    env.pop("CONSOLE_BOB", None)
    argv = [sys.executable, "-m", "ctrlrun.cli", "console", "--policy", str(lg.policy)]
    for bad in (["--store-url", f"sqlite:///{tmp_path / 'none.db'}"], ["--tls-key", "k.pem"]):
        refused = subprocess.run(
            [*argv, *bad], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env
        )
        assert refused.returncode == 2
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert "bob" not in refused.stderr


def test_over_tls_the_cookie_is_secure_and_the_origin_https(lg: Ledger, tmp_path: Path) -> None:
    pem = self_signed(tmp_path)
    request_id = lg.ask_approval("pi_tls")
    with running(lg, tls_cert=str(pem)) as server:
        assert server.url.startswith("https://127.0.0.1:")
        with httpx.Client(
            base_url=server.url,
            verify=ssl.create_default_context(cafile=str(pem)),
            timeout=10,
            trust_env=False,
        ) as c:
            form = c.get("/login")
            assert form.headers["set-cookie"].endswith("; Secure")
            csrf = login(c)
            http_origin = server.url.replace("https://", "http://")
            refused = c.post(
                "/approvals/answer",
                data={"csrf": csrf, "request_id": request_id, "decision": "approve"},
                headers={"Origin": http_origin},
            )
            assert refused.status_code == 403
            done = c.post(
                "/approvals/answer",
                data={"csrf": csrf, "request_id": request_id, "decision": "approve"},
                headers={"Origin": server.url},
            )
            assert done.status_code == 303
        with pytest.raises(httpx.HTTPError):  # plain HTTP to the TLS port: no answer
            httpx.get(http_origin + "/login", timeout=5, trust_env=False)
    assert approval(lg, request_id)["approver"] == "alice"
    with pytest.raises(InvalidArgument, match="cannot load the certificate"):
        build(
            ConsoleSettings(
                listen="127.0.0.1:0",
                store_url=lg.url,
                policy=str(lg.policy),
                tls_cert=str(tmp_path / "missing.pem"),
            ),
            {"CONSOLE_ALICE": "x" * 16},
        )


def test_a_quorum_is_two_operators_on_the_page(tmp_path: Path) -> None:
    text = POLICY.replace(
        "    decision: approve\n", "    decision: approve\n    approvals_required: 2\n", 1
    )
    lg = new_ledger(tmp_path, text)
    request_id = lg.ask_approval("pi_quorum")
    with running(lg) as server, client(server) as alice, client(server) as bob:
        csrf_a, csrf_b = login(alice), login(bob, "bob")
        form = {"request_id": request_id, "decision": "approve"}
        first = alice.post("/approvals/answer", data={**form, "csrf": csrf_a})
        assert first.status_code == 303
        page = alice.get("/approvals").text
        assert "1 of 2 approvals; waiting for another operator" in page
        assert "alice (1 of 2 approvals" in page  # the table names who approved so far
        assert approval(lg, request_id)["status"] == "pending"
        twice = alice.post("/approvals/answer", data={**form, "csrf": csrf_a})
        assert twice.status_code == 409 and "alice already approved" in twice.text
        second = bob.post("/approvals/answer", data={**form, "csrf": csrf_b})
        assert second.status_code == 303
        assert f"granted {request_id} by alice, bob" in bob.get("/approvals").text
    assert approval(lg, request_id)["status"] == "granted"


def test_the_console_over_postgresql(tmp_path: Path) -> None:
    with postgres_database() as url:
        lg = new_ledger(tmp_path, url=url)
        try:
            request_id, key = lg.ask_approval("pi_pg"), lg.make_ambiguous(5)
            with running(lg) as server, client(server) as c:
                csrf = login(c, "bob")
                for path, data in [
                    ("/approvals/answer", {"request_id": request_id, "decision": "approve"}),
                    (
                        "/ambiguous/settle",
                        {"effect_key": key, "state": "failed", "note": "no push"},
                    ),
                    ("/freeze", {"action": "", "reason": "maintenance"}),
                ]:
                    got = c.post(path, data={**data, "csrf": csrf})
                    assert got.status_code == 303, (path, got.text[-500:])
                assert "Chain intact" in c.get("/receipts").text
                frozen = c.get("/freeze").text
                assert "<td>every action</td><td>maintenance</td><td>bob</td>" in frozen
            assert approval(lg, request_id)["approver"] == "bob"
            assert effect_state(lg, key) == "failed"
            assert resolved_events(lg, key)[0]["note"] == "no push"
        finally:
            lg.control.store.close()


def test_a_ledger_that_is_gone_is_a_clear_page(lg: Ledger) -> None:
    with running(lg) as server, client(server) as c:
        login(c)
        Path(lg.url.removeprefix("sqlite:///")).unlink()
        got = c.get("/approvals")
        assert got.status_code == 503 and "Traceback" not in got.text
        assert "ledger" in got.text


def test_the_login_page_names_no_operator(lg: Ledger) -> None:
    with running(lg) as server, client(server) as c:
        page = c.get("/login").text
        assert "alice" not in page and "bob" not in page


def test_garbage_on_the_socket_is_answered_and_the_console_goes_on(lg: Ledger) -> None:
    import socket

    with running(lg) as server:
        host, port = server.server_address[0], int(server.server_address[1])
        for garbage in [b"\x16\x03\x01\x00\xa5garbage\r\n\r\n", b"GET\r\n\r\n", b"\r\n"]:
            with socket.create_connection((str(host), port), timeout=5) as sock:
                sock.sendall(garbage)
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(5)
                while sock.recv(4096):
                    pass
        with client(server) as c:
            assert c.get("/login").status_code == 200


def test_behind_a_tls_proxy_its_public_origin_is_accepted(lg: Ledger) -> None:
    # What a browser sends through a TLS proxy that passes the Host on, or rewrites it. The
    # cookie is Secure (the browser is on https), so it is handed back by hand here.
    request_id = lg.ask_approval("pi_behind")
    public = "https://console.example:8443"

    def cookie_of(reply: httpx.Response) -> dict[str, str]:
        set_cookie = reply.headers["set-cookie"]
        assert "Secure" in set_cookie, set_cookie
        return {"Cookie": set_cookie.split(";", 1)[0]}

    with running(lg, public_url=public + "/") as server, client(server) as c:
        passed_on = {"Host": "console.example:8443", "Origin": public}
        for headers in ({"Origin": public}, passed_on):  # the Host rewritten, or as sent
            form = c.get("/login", headers=headers)
            creds = {"operator": "alice", "token": TOKENS["alice"], "csrf": csrf_of(form.text)}
            c.cookies.clear()
            done = c.post("/login", data=creds, headers={**headers, **cookie_of(form)})
            assert done.status_code == 303, done.text
        session = {**passed_on, **cookie_of(done)}
        base = done.headers["location"].removesuffix("/approvals")  # the session's own path
        c.cookies.clear()
        page = c.get(base + "/approvals", headers=session)
        answer = {"request_id": request_id, "decision": "approve", "csrf": csrf_of(page.text)}
        evil = {**session, "Origin": "https://evil.example"}
        assert c.post(base + "/approvals/answer", data=answer, headers=evil).status_code == 403
        assert c.post(base + "/approvals/answer", data=answer, headers=session).status_code == 303
        assert c.get("/", headers={"Host": "evil.example"}).status_code == 421
    assert approval(lg, request_id)["status"] == "granted"


@pytest.mark.parametrize(
    "url", ["console.example", "ftp://console.example", "https://c.example/ops", "https://:1"]
)
def test_a_bad_public_url_is_one_line(lg: Ledger, url: str) -> None:
    settings = ConsoleSettings(listen="127.0.0.1:0", store_url=lg.url, policy=str(lg.policy))
    with pytest.raises(InvalidArgument, match="--public-url"):
        build(replace(settings, public_url=url), ENV)


def test_a_control_character_in_a_form_is_a_bad_request_that_changes_nothing(lg: Ledger) -> None:
    key = lg.make_ambiguous(7)
    with running(lg) as server, client(server) as c:
        csrf = login(c)
        for path, data in [
            ("/freeze", {"action": "", "reason": "refund loop\x00"}),
            ("/ambiguous/settle", {"effect_key": key, "state": "failed", "note": "gone\x1b[2J"}),
            ("/freeze", {"action": "stripe.refund\x07", "reason": "loop"}),
        ]:
            got = c.post(path, data={**data, "csrf": csrf})
            assert got.status_code == 400, (path, got.text)
            assert "control character" in got.text and "Nothing was changed" in got.text
        said = {"effect_key": key, "state": "committed", "note": "re_1 found\r\n\tin the log"}
        assert c.post("/ambiguous/settle", data={**said, "csrf": csrf}).status_code == 303
    assert freezes_and_receipts(lg)[0] == []
    assert effect_state(lg, key) == "committed"


def test_a_freeze_of_a_name_the_policy_lacks_says_it_may_be_a_typo(lg: Ledger) -> None:
    with running(lg) as server, client(server) as c:
        csrf = login(c)
        for action, typo in [("stripe.refnud", True), ("stripe.refund", False), ("", False)]:
            done = c.post("/freeze", data={"csrf": csrf, "action": action, "reason": "loop"})
            assert done.status_code == 303
            page = c.get("/freeze").text
            warned = "if that is a typo, nothing is frozen" in page
            assert warned is typo, (action, page)
    frozen, _ = freezes_and_receipts(lg)  # frozen all the same: another policy may have it
    assert sorted(f.scope for f in frozen) == ["*", "stripe.refnud", "stripe.refund"]  # type: ignore[attr-defined]
