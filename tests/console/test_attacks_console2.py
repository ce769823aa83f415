"""Attacks on the console by a local client without an operator's token: connections that hold
the console's slots while sending nothing, forms from another loopback port, a session id
replayed after logout or fixed before login, log lines forged through a form."""

from __future__ import annotations

import logging
import socket
import ssl
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
from console_support import (
    TOKENS,
    Ledger,
    client,
    csrf_of,
    login,
    new_ledger,
    running,
    self_signed,
)
from test_console_cap import address, idle, read_all

from ctrlrun.console import ConsoleServer, auth

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def lg(tmp_path: Path) -> Ledger:
    return new_ledger(tmp_path)


def approves(srv: ConsoleServer, request_id: str) -> None:
    """An operator logs in and approves ``request_id``: every step is answered, none a 503."""
    with client(srv) as c:
        csrf = login(c)
        got = c.post(
            "/approvals/answer",
            data={"csrf": csrf, "request_id": request_id, "decision": "approve"},
        )
        assert got.status_code == 303, got.text


def status_of(lg: Ledger, request_id: str) -> str:
    with lg.store().reading() as conn:
        from sqlalchemy import select

        from ctrlrun.schema import approvals

        query = select(approvals.c.status).where(approvals.c.approval_id == request_id)
        return str(conn.execute(query).scalar_one())


@contextmanager
def kept_alive(srv: ConsoleServer, n: int) -> Iterator[list[httpx.Client]]:
    """``n`` clients that asked for the login page once and keep their connections open."""
    with ExitStack() as stack:
        clients = [stack.enter_context(client(srv)) for _ in range(n)]
        for c in clients:
            assert c.get("/login").status_code == 200
        yield clients


def test_connections_that_send_nothing_do_not_lock_operators_out(lg: Ledger) -> None:
    request_id = lg.ask_approval("pi_idle1")
    with running(lg) as srv, idle(srv, 64) as socks:  # the default cap, each slot held
        approves(srv, request_id)
        assert read_all(socks[0]) == b""  # the longest waiting gave its slot up
    assert status_of(lg, request_id) == "granted"


def test_kept_alive_connections_do_not_lock_operators_out(lg: Ledger) -> None:
    request_id = lg.ask_approval("pi_idle2")
    with running(lg, max_connections=4) as srv, kept_alive(srv, 4) as clients:
        approves(srv, request_id)
        # The dropped ones reconnect when they ask again (browsers do the same).
        assert all(c.get("/login").status_code == 200 for c in clients)
    assert status_of(lg, request_id) == "granted"


@pytest.mark.parametrize(
    "sent",
    [
        b"GET /login HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Trickle: a",  # a head still arriving
        b"POST /freeze HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 900\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n\r\nreason=x",  # a body
        b"GET",  # a request line
    ],
)
def test_requests_trickled_in_do_not_lock_operators_out(lg: Ledger, sent: bytes) -> None:
    request_id = lg.ask_approval("pi_trickle")
    with running(lg, max_connections=3) as srv, idle(srv, 3) as socks:
        for sock in socks:
            sock.sendall(sent)
        approves(srv, request_id)
        assert read_all(socks[0]) == b""
        with pytest.raises(OSError):  # what it sends after is never read
            for _ in range(3):
                socks[0].sendall(b"x" * 1000)
                time.sleep(0.05)
    assert status_of(lg, request_id) == "granted"
    with lg.store().reading() as conn:
        from ctrlrun.freeze import list_freezes

        assert not list_freezes(conn)


def test_a_form_from_another_loopback_port_is_refused(lg: Ledger) -> None:
    request_id = lg.ask_approval("pi_port")
    with running(lg) as srv, client(srv) as c:
        csrf = login(c)
        host, port = address(srv)
        data = {"csrf": csrf, "request_id": request_id, "decision": "approve"}
        for headers in (
            {"Origin": f"http://{host}:{port + 1}"},
            {"Origin": f"http://{host}"},
            {"Origin": f"https://{host}:{port}"},
            {"Sec-Fetch-Site": "same-site"},  # a page on another port is same-site
            {"Origin": "null", "Sec-Fetch-Site": "same-site"},
        ):
            got = c.post("/approvals/answer", data=data, headers=headers)
            assert got.status_code == 403, headers
    assert status_of(lg, request_id) == "pending"


def test_a_session_id_is_worth_nothing_after_logout_or_from_before_login(lg: Ledger) -> None:
    request_id = lg.ask_approval("pi_replay")
    with running(lg) as srv, client(srv) as c:
        form = c.get("/login")
        fixed = auth.session_id(form.headers["set-cookie"])
        csrf = login(c)
        assert c.cookies[auth.COOKIE] != fixed  # a new id at login
        used = c.cookies[auth.COOKIE]
        assert c.post("/logout", data={"csrf": csrf}).status_code == 303
        data = {"csrf": csrf, "request_id": request_id, "decision": "approve"}
        for sid in (used, fixed):
            with client(srv) as replay:
                replay.cookies.set(auth.COOKIE, sid)
                got = replay.post("/approvals/answer", data=data)
                assert got.status_code in (401, 403), got.status_code
    assert status_of(lg, request_id) == "pending"


def test_a_line_end_in_a_freeze_reason_forges_no_log_line(
    lg: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    forged = "x\nconsole: bob: granted apr_1 by bob\r\nconsole: bob logged in"
    at_info = caplog.at_level(logging.INFO, logger="ctrlrun.console")
    with at_info, running(lg) as srv, client(srv) as c:
        csrf = login(c)
        got = c.post("/freeze", data={"csrf": csrf, "action": "ops.push", "reason": forged})
        assert got.status_code == 303
        assert "ops.push" in c.get("/freeze").text
    said = [r.getMessage() for r in caplog.records]
    assert not any(line.startswith("console: bob") for m in said for line in m.splitlines())
    assert not any("\n" in m or "\r" in m for m in said)
    assert TOKENS["alice"] not in "".join(said)


def test_a_late_second_approval_and_an_unknown_id_change_nothing(lg: Ledger) -> None:
    request_id = lg.ask_approval("pi_twice")
    with running(lg) as srv, client(srv) as c:
        csrf = login(c)
        data = {"csrf": csrf, "request_id": request_id, "decision": "approve"}
        assert c.post("/approvals/answer", data=data).status_code == 303
        again = c.post("/approvals/answer", data=data)
        assert again.status_code == 409 and "not pending" in again.text
        deny = c.post("/approvals/answer", data={**data, "decision": "deny"})
        assert deny.status_code == 409
        other = c.post("/approvals/answer", data={**data, "request_id": request_id + "x"})
        assert other.status_code == 409
        assert csrf_of(c.get("/approvals").text) == csrf
    assert status_of(lg, request_id) == "granted"


def test_an_idle_socket_closed_by_its_client_frees_its_slot(lg: Ledger) -> None:
    with running(lg, max_connections=2) as srv:
        for _ in range(3):
            with socket.create_connection(address(srv), timeout=5):
                pass
        with client(srv) as c:
            assert c.get("/login").status_code == 200


def wrong_login(srv: ConsoleServer, name: str, token: str = "guess") -> int:
    """A login as ``name`` from a fresh client: the status it is answered."""
    with client(srv) as c:
        form = c.get("/login")
        data = {"csrf": csrf_of(form.text), "operator": name, "token": token}
        return c.post("/login", data=data).status_code


def test_guesses_sent_at_once_wait_one_after_another_and_hold_no_slot(lg: Ledger) -> None:
    # Before, each wrong token held its connection's slot for the wait: as many guesses at once
    # as --max-connections were answered together, and the console was a 503 for everyone.
    with running(lg) as srv, client(srv) as alice:
        login(alice)  # a right token waits for nothing
        srv.app.login_delay = 2.0
        first = ThreadPoolExecutor(1)
        held = first.submit(wrong_login, srv, "alice")
        deadline = time.monotonic() + 5
        while srv.app.login_gate.enter("alice"):  # until the wrong token above is waited out
            srv.app.login_gate.leave("alice")
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with ThreadPoolExecutor(8) as pool:  # guesses at once: each answered at once
            answers = list(pool.map(lambda _: wrong_login(srv, "alice"), range(8)))
        assert answers == [429] * 8
        assert wrong_login(srv, "alice", TOKENS["alice"]) == 429  # unread while one waits
        assert alice.get("/approvals").status_code == 200  # the session goes on: no 503
        with client(srv) as bob:
            login(bob, "bob")
        assert held.result(10) == 401
        first.shutdown()
        with client(srv) as again:
            login(again, "alice")


def test_over_tls_handshakes_never_started_do_not_lock_operators_out(
    lg: Ledger, tmp_path: Path
) -> None:
    pem = self_signed(tmp_path)
    verify = ssl.create_default_context(cafile=str(pem))
    with running(lg, tls_cert=str(pem), max_connections=2) as srv, idle(srv, 2) as socks:
        with httpx.Client(base_url=srv.url, verify=verify, timeout=10, trust_env=False) as c:
            assert c.get("/login").status_code == 200
        assert read_all(socks[0]) == b""


def test_an_approval_past_its_expiry_is_not_granted_late(lg: Ledger) -> None:
    from sqlalchemy import update

    from ctrlrun.schema import approvals

    request_id = lg.ask_approval("pi_late2")
    with running(lg) as srv, client(srv) as c:
        csrf = login(c)
        store = lg.store()
        with store.transaction() as conn:  # its time ran out; no sidecar has marked it yet
            past = "2000-01-01T00:00:00.000000Z"
            where = approvals.c.approval_id == request_id
            conn.execute(update(approvals).where(where).values(expires_at=past))
        store.close()
        data = {"csrf": csrf, "request_id": request_id, "decision": "approve"}
        late = c.post("/approvals/answer", data=data)
        assert late.status_code == 409 and "expired" in late.text
    assert status_of(lg, request_id) != "granted"  # the sidecars' sweep records it expired
