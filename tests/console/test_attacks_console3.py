"""Attacks on the console from another server on the same host: a browser sends a cookie to
every port of its host, so a server on another port of 127.0.0.1 (a dev server, a page an agent
serves) sees what the console's cookie would give it. The operator's cookie lives under a
secret path of its own session (``/s/PREFIX``), which no other server is asked for; the
documented addresses still lead, through the login, to their page. Also: a login that would
send the browser elsewhere, cookies another server sets, the prefix in log lines, headers on
every answer, attacker-chosen names rendered in pages.

The clients here keep cookies as browsers do (httpx's cookie jar, which like a browser ignores
ports), and one test drives headless Chromium."""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from console_support import TOKENS, Ledger, csrf_of, new_ledger, running

import ctrlrun
from ctrlrun.console import ConsoleServer, auth

pytestmark = pytest.mark.timeout(120)
PAGES = ["/approvals", "/ambiguous", "/receipts", "/freeze"]
NEXT = re.compile(r'name="next" value="([^"]*)"')


@pytest.fixture
def lg(tmp_path: Path) -> Ledger:
    return new_ledger(tmp_path)


@dataclass
class Other:
    """Another server on 127.0.0.1: what each request to it carried in ``Cookie``."""

    url: str
    seen: list[tuple[str, str]] = field(default_factory=list)  # (path, Cookie header)
    sets: list[str] = field(default_factory=list)  # Set-Cookie values it answers with

    def cookies(self) -> str:
        return " ".join(cookie for _, cookie in self.seen)


@contextmanager
def other_server(sets: list[str] | None = None) -> Iterator[Other]:
    other = Other("", sets=sets or [])
    page = b"<!DOCTYPE html><title>other</title><p>another server on this host</p>"

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            other.seen.append((self.path, "; ".join(self.headers.get_all("Cookie") or [])))
            self.send_response(200)
            for value in other.sets:
                self.send_header("Set-Cookie", value)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    other.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield other
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


def browser_like() -> httpx.Client:
    """One cookie jar for every server, absolute URLs, as a browser keeps them."""
    return httpx.Client(timeout=10, trust_env=False, follow_redirects=False)


def log_in(c: httpx.Client, srv: ConsoleServer, name: str = "alice", query: str = "") -> str:
    """Log in through the login page; the session's own address (``http://.../s/PREFIX``)."""
    form = c.get(f"{srv.url}/login{query}")
    assert form.status_code == 200
    fields = {"csrf": csrf_of(form.text), "operator": name, "token": TOKENS[name]}
    nxt = NEXT.search(form.text)
    fields["next"] = nxt.group(1) if nxt else ""
    done = c.post(f"{srv.url}/login", data=fields)
    assert done.status_code == 303, done.text
    where = done.headers["location"]
    assert where.startswith("/s/"), where
    return srv.url + where.rsplit("/", 1)[0]


def approval_status(lg: Ledger, request_id: str) -> str:
    from sqlalchemy import select

    from ctrlrun.schema import approvals

    store = lg.store()
    try:
        with store.reading() as conn:
            query = select(approvals.c.status).where(approvals.c.approval_id == request_id)
            return str(conn.execute(query).scalar_one())
    finally:
        store.close()


# -- 1. the cookie and another port --------------------------------------------------------


def test_the_operators_cookie_never_reaches_another_port_of_the_host(lg: Ledger) -> None:
    request_id = lg.ask_approval("pi_port1")
    with running(lg) as srv, other_server() as other, browser_like() as c:
        home = log_in(c, srv)
        sid = c.cookies.get(auth.COOKIE, path=home.split(srv.url, 1)[1])
        assert sid and len(sid) > 40
        assert c.get(srv.url + "/login").status_code == 200  # a login form's cookie again
        for path in ["/", "/approvals", "/login", "/s/", "/s/x/approvals", "/receipts?x"]:
            assert c.get(other.url + path).status_code == 200
        # The jar ignores ports, as browsers do: the login form's cookie (worth nothing) did go
        # to the other server's /login, which proves the operator's would have gone anywhere.
        assert any(p == "/login" and auth.COOKIE in cookie for p, cookie in other.seen)
        assert sid not in other.cookies()
        assert c.get(home + "/approvals").status_code == 200  # the console still gets it
        # Whatever the other server got is worth nothing at the console.
        for _, cookie in other.seen:
            with httpx.Client(base_url=srv.url, timeout=10, trust_env=False) as replay:
                for path in ["/approvals", home.split(srv.url, 1)[1] + "/approvals"]:
                    got = replay.get(path, headers={"Cookie": cookie})
                    assert got.status_code == 303 and request_id not in got.text
    assert approval_status(lg, request_id) == "pending"


def test_the_documented_addresses_lead_to_their_page_through_the_login(lg: Ledger) -> None:
    with running(lg) as srv, browser_like() as c:
        assert c.get(srv.url + "/").headers["location"] == "/login"
        for page in PAGES:
            got = c.get(srv.url + page)
            assert got.status_code == 303 and got.headers["location"].startswith("/login")
            query = got.headers["location"].removeprefix("/login")
            home = log_in(c, srv, query=query)
            landed = c.get(home + page)
            assert landed.status_code == 200 and f'href="{home.split(srv.url)[1]}{page}"' in (
                landed.text
            )
            assert c.get(home).headers["location"].endswith("/approvals")  # /s/PREFIX itself
            assert c.get(home + "/").headers["location"].endswith("/approvals")
            assert c.get(home + "/login").headers["location"].endswith("/approvals")


@pytest.mark.parametrize(
    "asked",
    [
        "https://evil.example/approvals",
        "//evil.example/approvals",
        "/\\evil.example",
        "/approvals/../../evil",
        "/s/someone-else/approvals",
        "javascript:alert(1)",
        "/approvals\r\nSet-Cookie: x=1",
        "/approvals?x=1",
    ],
)
def test_a_login_never_leads_off_the_console(lg: Ledger, asked: str) -> None:
    from urllib.parse import quote

    with running(lg) as srv, browser_like() as c:
        form = c.get(f"{srv.url}/login?next={quote(asked)}")
        assert 'name="next" value="/approvals"' in form.text
        fields = {"csrf": csrf_of(form.text), "operator": "alice", "token": TOKENS["alice"]}
        done = c.post(srv.url + "/login", data={**fields, "next": asked})
        where = done.headers["location"]
        assert done.status_code == 303 and where.startswith("/s/") and where.count("/") == 3
        assert where.endswith("/approvals") and "\r" not in where and "\n" not in where
        wrong = c.post(srv.url + "/login", data={**fields, "token": "guess", "next": asked})
        assert wrong.status_code in (401, 403) and 'name="next" value="/approvals"' in wrong.text


def test_a_session_is_answered_only_under_its_own_prefix(lg: Ledger) -> None:
    request_id = lg.ask_approval("pi_prefix1")
    with running(lg) as srv, browser_like() as alice, browser_like() as bob:
        home_a, home_b = log_in(alice, srv), log_in(bob, srv, "bob")
        path_a, path_b = home_a.split(srv.url)[1], home_b.split(srv.url)[1]
        sid_a = alice.cookies.get(auth.COOKIE, path=path_a)
        csrf_a = csrf_of(alice.get(home_a + "/approvals").text)
        stolen = {"Cookie": f"{auth.COOKIE}={sid_a}"}
        data = {"csrf": csrf_a, "request_id": request_id, "decision": "approve"}
        with httpx.Client(base_url=srv.url, timeout=10, trust_env=False) as replay:
            for path in [f"{path_b}/approvals", "/s/guessed/approvals", "/s//approvals"]:
                got = replay.get(path, headers=stolen)
                assert got.status_code == 303, path
                assert got.headers["location"].startswith("/login?expired"), path
            for path in PAGES:  # unprefixed: never a session, whatever the cookie
                assert replay.get(path, headers=stolen).headers["location"].startswith("/login")
            for path in [
                "/approvals/answer",
                f"{path_b}/approvals/answer",
                "/s/x/approvals/answer",
            ]:
                got = replay.post(path, data=data, headers=stolen)
                assert got.status_code == 401 and "Nothing" not in got.text, path
            got = replay.post(f"{path_a}/logout", data={"csrf": csrf_a}, headers=stolen)
            cleared = got.headers.get_list("set-cookie")
            assert got.status_code == 303 and any(f"Path={path_a}; Max-Age=0" in x for x in cleared)
        assert alice.get(home_a + "/approvals").headers["location"] == "/login?expired"
        assert bob.get(home_b + "/approvals").status_code == 200
    assert approval_status(lg, request_id) == "pending"


def test_cookies_another_server_sets_do_not_lock_operators_out(lg: Ledger) -> None:
    # Any server on the host may set a cookie for 127.0.0.1, of our name and any path.
    tossed = [
        f"{auth.COOKIE}=tossed-root; Path=/",
        f"{auth.COOKIE}=tossed-login; Path=/login",
        f"{auth.COOKIE}=tossed-s; Path=/s",
    ]
    request_id = lg.ask_approval("pi_tossed")
    with running(lg) as srv, other_server(tossed) as other, browser_like() as c:
        assert c.get(other.url + "/").status_code == 200
        assert len(c.cookies.jar) == 3
        home = log_in(c, srv)
        page = c.get(home + "/approvals")
        assert page.status_code == 200 and request_id in page.text
        done = c.post(
            home + "/approvals/answer",
            data={"csrf": csrf_of(page.text), "request_id": request_id, "decision": "approve"},
        )
        assert done.status_code == 303
        # The login cleared the cookie at Path=/ (no operator cookie may live there).
        assert "tossed-root" not in [ck.value for ck in c.cookies.jar]
    assert approval_status(lg, request_id) == "granted"


# -- 2. what is logged, and what every answer carries ------------------------------------------


def raw(srv: ConsoleServer, data: bytes) -> bytes:
    host, port = str(srv.server_address[0]), int(srv.server_address[1])
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    return got


def test_the_session_prefix_is_never_in_a_log_line(
    lg: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG), running(lg) as srv, browser_like() as c:
        home = log_in(c, srv)
        prefix = home.rsplit("/", 1)[1]
        base = home.split(srv.url)[1]
        assert c.get(home + "/receipts").status_code == 200
        assert c.get(home + "/nowhere").status_code == 404
        host = srv.url.split("//")[1]
        for line in [
            f"GET {base}/approvals HTTP/1.1 extra",  # a request line it cannot read
            f"GET {base}/approvals HTTP/9.9",
            f"PUT {base}/approvals HTTP/1.1",  # a method it does not serve
        ]:
            answer = raw(srv, f"{line}\r\nHost: {host}\r\n\r\n".encode())
            assert prefix.encode() not in answer  # (a bad version: http.server's HTTP/0.9 body)
    # The console's lines (not the test client's own: httpx logs the URLs it asks for).
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("ctrlrun"))
    assert "/s/.../receipts" in logged and "PUT" in logged
    assert prefix not in logged and TOKENS["alice"] not in logged
    assert all(ck.value not in logged for ck in c.cookies.jar)


def test_every_answer_forbids_framing_and_sniffing(lg: Ledger) -> None:
    with running(lg) as srv, browser_like() as c:
        home = log_in(c, srv)
        host = srv.url.split("//")[1]
        answers = [
            raw(srv, f"GET /approvals HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()),  # 303
            raw(srv, b"GET /login HTTP/1.1\r\nHost: evil.example\r\n\r\n"),  # 421
            raw(srv, f"PUT /login HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()),  # 501
            raw(srv, f"GET /login HTTP/1.1\r\nHost: {host}\r\nX: {'x' * 70000}\r\n\r\n".encode()),
            raw(srv, f"HEAD /login HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()),
        ]
        for got in [c.get(home + "/nowhere"), c.get(home + "/approvals")]:
            answers.append(b"\r\n".join(f"{k}: {v}".encode() for k, v in got.headers.items()))
        for answer in answers:
            head = answer.split(b"\r\n\r\n", 1)[0].lower()
            assert b"x-frame-options: deny" in head, head
            assert b"frame-ancestors 'none'" in head and b"nosniff" in head, head


# -- 3. attacker-chosen names in the pages -------------------------------------------------

HOSTILE = "\"'><img src=x onerror=alert(1)><script>alert(2)</script>{{7*7}}"


class Tags(HTMLParser):
    """Every tag and attribute a page holds."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attrs: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs.extend(attrs)


def test_attacker_chosen_names_are_text_on_every_page(lg: Ledger) -> None:
    @ctrlrun.protect("stripe.refund", control=lg.control)
    def refund(payment_id: str, amount: int) -> str:
        return "done"

    @ctrlrun.protect("ops.push", control=lg.control)
    def push(n: str) -> None:
        raise ConnectionResetError("the remote hung up")

    with ctrlrun.context(agent=HOSTILE, user=HOSTILE), pytest.raises(ctrlrun.ApprovalRequired):
        refund(payment_id=HOSTILE, amount=1)
    with ctrlrun.context(agent=HOSTILE), pytest.raises(ConnectionResetError):
        push(n=HOSTILE)
    allowed = {"html", "head", "meta", "title", "link", "body", "header", "strong", "a", "span"}
    allowed |= {"form", "input", "button", "main", "h1", "h2", "p", "table", "thead", "tbody"}
    allowed |= {"tr", "th", "td", "code", "pre", "div", "textarea", "label", "em", "ul", "li"}
    with running(lg) as srv, browser_like() as c:
        home = log_in(c, srv)
        csrf = csrf_of(c.get(home + "/freeze").text)
        frozen = c.post(home + "/freeze", data={"csrf": csrf, "action": HOSTILE, "reason": HOSTILE})
        assert frozen.status_code == 303
        for page in PAGES:
            text = c.get(home + page).text
            assert HOSTILE not in text and "&lt;script&gt;" in text, page
            tags = Tags()
            tags.feed(text)
            assert tags.tags <= allowed, (page, tags.tags - allowed)
            assert not [a for a, _ in tags.attrs if a.startswith("on")], page
            assert not [v for _, v in tags.attrs if v and v.lower().startswith("javascript:")]


# -- 4. in a real browser -------------------------------------------------------------------


def test_in_chromium_the_cookie_stays_with_the_console(lg: Ledger, tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parents[1] / "e2e"))
    from browser_support import WAIT, chromium, need_browser, wait_for

    need_browser()
    from selenium.webdriver.common.by import By

    request_id = lg.ask_approval("pi_chromium")
    with running(lg) as srv, other_server() as other, chromium() as driver:
        driver.get(srv.url + "/receipts")  # a documented address: the login, then that page
        wait_for(driver, "the login form", lambda d: d.find_elements(By.ID, "login"))
        driver.find_element(By.ID, "operator").send_keys("alice")
        driver.find_element(By.ID, "token").send_keys(TOKENS["alice"])
        driver.find_element(By.CSS_SELECTOR, "button.login").click()
        wait_for(driver, "the receipts page", lambda d: d.current_url.endswith("/receipts"))
        home = str(driver.current_url).removesuffix("/receipts")
        assert home.startswith(srv.url + "/s/")
        cookie = driver.get_cookie(auth.COOKIE)
        assert cookie and cookie["path"] == home.split(srv.url)[1] and cookie["httpOnly"]
        for path in ["/", "/approvals", "/login", "/s/"]:
            driver.get(other.url + path)
            wait_for(driver, "the other page", lambda d: "another server" in d.page_source, WAIT)
        asked = [p for p, _ in other.seen if p != "/favicon.ico"]
        assert asked == ["/", "/approvals", "/login", "/s/"]
        assert cookie["value"] not in other.cookies()
        driver.get(home + "/approvals")  # the console's own pages still have it
        wait_for(driver, request_id, lambda d: request_id in d.page_source)
        driver.find_element(By.CSS_SELECTOR, "header button").click()  # log out
        wait_for(driver, "the login form", lambda d: d.find_elements(By.ID, "login"))
        driver.get(home + "/approvals")  # its cookie is gone: the login form
        wait_for(driver, "the login form", lambda d: d.find_elements(By.ID, "login"))
        assert request_id not in driver.page_source
    assert approval_status(lg, request_id) == "pending"


# -- 5. floods -------------------------------------------------------------------------------


def unread(srv: ConsoleServer, n: int, requests: int = 3000) -> list[socket.socket]:
    """``n`` connections that each send ``requests`` GET /login at once and read none of the
    answers: the console's writes to them stall once the socket buffers are full."""
    host, port = str(srv.server_address[0]), int(srv.server_address[1])
    line = f"GET /login HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode() * requests
    socks = []
    for _ in range(n):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, port))
        sock.settimeout(1.0)
        with contextlib.suppress(TimeoutError):  # the console stopped reading: it writes
            sock.sendall(line)  # answers nobody reads
        socks.append(sock)
    stalled(srv)
    return socks


def stalled(srv: ConsoleServer, polls: int = 200) -> None:
    """Wait (bounded) until every connection is stuck waiting on its client: no slot answering
    a request, and no progress between two looks, a tenth of a second apart."""
    seen: dict[Any, int | None] | None = None
    for _ in range(polls):
        now = dict(srv._open)
        if seen == now and None not in now.values():
            return
        seen = now
        time.sleep(0.1)
    raise AssertionError(f"the console's connections never stalled: {list(now.values())}")


def test_answers_nobody_reads_do_not_lock_operators_out(lg: Ledger) -> None:
    request_id = lg.ask_approval("pi_unread")
    with running(lg, max_connections=3) as srv:
        socks = unread(srv, 3)
        try:
            with browser_like() as c:
                home = log_in(c, srv)  # every step answered: none a 503
                page = c.get(home + "/approvals")
                form = {"csrf": csrf_of(page.text), "request_id": request_id}
                done = c.post(home + "/approvals/answer", data={**form, "decision": "approve"})
                assert done.status_code == 303
        finally:
            for sock in socks:
                sock.close()
    assert approval_status(lg, request_id) == "granted"


# -- 6. guessing -------------------------------------------------------------------------------


def test_a_token_short_enough_to_guess_is_warned_about_never_shown(
    lg: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    from ctrlrun.console import ConsoleSettings, build

    settings = ConsoleSettings(listen="127.0.0.1:0", store_url=lg.url, policy=str(lg.policy))
    with caplog.at_level(logging.WARNING, logger="ctrlrun.console"):
        srv = build(settings, {"CONSOLE_ALICE": "password", "CONSOLE_BOB": TOKENS["bob"]})
    try:
        # Still a login (a deployment's tokens keep working), but the operator is told.
        assert set(srv.app.tokens) == {"alice", "bob"}
        said = " ".join(r.getMessage() for r in caplog.records)
        assert "alice" in said and "fewer than 16 characters" in said
        assert "password" not in said and "bob" not in said
    finally:
        srv.server_close()
        srv.app.store.close()
