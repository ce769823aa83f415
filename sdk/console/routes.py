"""The console's requests: who may see what, which POST may change what, and the answers.

Every request is checked in this order: the ``Host`` it names (a console on loopback answers
only to its own names, so a DNS-rebinding page cannot reach it), then for a POST where it comes
from (``Origin`` and ``Sec-Fetch-Site``, when the browser sends them, must be the console's
own), the session cookie (an operator's only under its own secret path, ``scope``), and the
form's CSRF token. A POST that fails any check is refused
before anything is read or written. GET never changes the ledger.

``Origin: null`` counts as no Origin: with ``Referrer-Policy: no-referrer`` a browser sends
``null`` for the console's own forms, so it cannot be told apart from a cross-site page that
asks for the same; those are refused by ``Sec-Fetch-Site``, the SameSite=Strict cookie and the
CSRF token, which a page elsewhere cannot read.
"""

from __future__ import annotations

import logging
import re
import ssl
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ctrlrun.errors import CTRLRunError, InvalidArgument, StoreError
from ctrlrun.store import StateStore

from . import acts, auth, board, forms, pages, scope
from .html import CSS, document

if TYPE_CHECKING:
    from .server import ConsoleServer

log = logging.getLogger(__name__)

CONTROL_OR_LINE_END = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029]")
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'none'; object-src 'none'; base-uri 'none'; "
        "form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}
TITLES = ("Approvals", "Ambiguous effects", "Receipts", "Freeze")
PAGES = dict(zip(scope.PAGES, TITLES, strict=True))


@dataclass
class Reply:
    """An answer: status, body, and the headers beyond the security ones."""

    status: int
    body: str = ""
    content_type: str = "text/html; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)
    cookies: list[str] = field(default_factory=list)  # Set-Cookie values, one header each


@dataclass
class App:
    """What every request of one console shares."""

    store: StateStore
    tokens: Mapping[str, str]  # operator -> token, read from the environment at start
    sessions: auth.Sessions
    hosts: frozenset[str] | None  # the Host values it answers to (None: any, listening on *)
    secure: bool = False  # served over TLS: the cookie is Secure
    login_delay: float = 0.5  # seconds a wrong token waits, to slow guessing
    public_origin: str | None = None  # --public-url: what browsers see through a TLS proxy
    actions: frozenset[str] | None = None  # the policy's action names (a freeze's typo)
    login_gate: auth.LoginGate = field(default_factory=auth.LoginGate)

    @property
    def scheme(self) -> str:
        return "https" if self.secure else "http"

    @property
    def secure_cookie(self) -> bool:
        """Whether browsers reach it over TLS (its own, or a proxy's in front)."""
        return self.secure or (self.public_origin or "").startswith("https://")


def one_line(text: str) -> str:
    """``text`` for a log line: a line end or control character in a form's value (a freeze's
    reason or action name) is escaped, so it cannot start a line of its own."""
    return CONTROL_OR_LINE_END.sub(lambda m: repr(m.group())[1:-1], text)


def redirect(to: str, cookies: list[str] | None = None) -> Reply:
    return Reply(303, "", headers={"Location": to}, cookies=cookies or [])


class Handler(BaseHTTPRequestHandler):
    """One request to the console (``ThreadingHTTPServer``: one thread each)."""

    server: ConsoleServer
    protocol_version = "HTTP/1.1"
    timeout = 30  # seconds a client may take to send its request
    server_version = "ctrlrun-console"

    def version_string(self) -> str:
        return self.server_version

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()  # bounded by ``timeout``, set by setup()

    def handle_one_request(self) -> None:
        self.server.waiting(self.connection)  # until its request has arrived, in whole
        super().handle_one_request()

    def do_GET(self) -> None:
        if self._serving():
            self._run(self._get)

    def do_POST(self) -> None:
        # Read first: a body left unread would be taken for the next request.
        form, read = forms.read(self.headers, self.rfile)
        self.close_connection = self.close_connection or not read
        if self._serving():
            self._run(lambda app, path: self._post(app, path, form))

    def _serving(self) -> bool:
        """Whether this connection still holds its slot, now that its request has arrived
        (while it waited, a new connection may have closed it to take its slot)."""
        if self.server.serving(self.connection):
            return True
        self.close_connection = True
        return False

    def end_headers(self) -> None:
        # On every answer, http.server's own too (a request it cannot read, a method it lacks).
        for name, value in HEADERS.items():
            self.send_header(name, value)
        super().end_headers()

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # The method and path only: never the query, never a header (cookies stay out).
        path = urlsplit(getattr(self, "path", "") or "").path  # unset: an unreadable request
        # Escaped: a control character in them (an ESC for the terminal) is the client's.
        shown = one_line(scope.shown(path)) if path else "-"
        method = one_line(self.command or "-")
        log.info("%s %s %s %s", self.address_string(), method, shown, code)

    def log_message(self, format: str, *args: Any) -> None:
        log.info("%s %s", self.address_string(), one_line(scope.redact(format % args)))

    # -- plumbing ----------------------------------------------------------------------------

    def _run(self, route: Callable[[App, str], Reply]) -> None:
        app = self.server.app
        path = urlsplit(self.path).path
        try:
            reply = self._host_refusal(app) or route(app, path)
        except StoreError as exc:  # the ledger is down or lost: say so (its URL hides passwords)
            log.error("console: %s %s: %s", self.command, one_line(scope.shown(path)), exc)
            reply = Reply(503, document("Unavailable", "", errors=[str(exc)]))
        except Exception as exc:  # a bug: a page, a log line, no traceback out
            where = "; ".join(
                f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}"
                for f in traceback.extract_tb(exc.__traceback__)[-3:]
            )
            log.error(
                "console: %s %s failed: %s at %s",
                self.command,
                one_line(scope.shown(path)),
                type(exc).__name__,
                where,
            )
            reply = Reply(500, document("Error", "", errors=["The console failed; see its log."]))
        self._send(reply)

    def _send(self, reply: Reply) -> None:
        body = reply.body.encode("utf-8")
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        for cookie in reply.cookies:
            self.send_header("Set-Cookie", cookie)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(body)))
        # What was asked is done: from here the connection waits on its client reading the
        # answer, and one that reads none (requests sent at once, answers left unread) may be
        # closed to make room like any other connection waiting on its client.
        self.server.waiting(self.connection)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _host_refusal(self, app: App) -> Reply | None:
        host = self.headers.get("Host", "")
        if app.hosts is None or host.lower() in app.hosts:
            return None
        return Reply(421, "this console does not answer to that host name\n", "text/plain")

    def _session(self, app: App, prefix: str | None) -> tuple[auth.Session | None, bool]:
        """The request's live session (an operator's under ``prefix``, a login form's when
        None), and whether it presented a cookie at all."""
        sids = auth.session_ids(self.headers.get_all("Cookie") or [])
        return app.sessions.find(sids, prefix=prefix), bool(sids)

    @staticmethod
    def _cookie(app: App, session: auth.Session | None, path: str) -> str:
        """The session's cookie under ``path``; for None, one that clears the cookie there."""
        if session is None:
            return auth.cookie_header("", path=path, secure=app.secure_cookie, max_age=0)
        return auth.cookie_header(session.sid, path=path, secure=app.secure_cookie)

    # -- GET -----------------------------------------------------------------------------------

    def _get(self, app: App, path: str) -> Reply:
        prefix, rest = scope.split(path)
        if rest == "/console.css":  # no data in it: the login page needs it too
            return Reply(200, CSS, "text/css; charset=utf-8")
        if rest == "/favicon.ico":  # asked for by every browser: nothing, without a session
            return Reply(204)
        query = urlsplit(self.path).query
        if prefix is None:  # never an operator's cookie here: the documented addresses log in
            if path == scope.LOGIN:
                session, _ = self._session(app, None)
                page, expired = scope.login_query(query)
                return self._login_page(app, session, page=page, expired=expired)
            return redirect(scope.to_login(path, expired=False))
        session, had_cookie = self._session(app, prefix)
        if session is None:
            return redirect(scope.to_login(rest, expired=had_cookie))
        if rest in ("/", scope.LOGIN):
            return redirect(scope.base(prefix) + scope.login_query(query)[0])
        if rest not in PAGES:
            return Reply(404, self._page(app, session, rest, errors=[f"no page {rest}"]))
        messages, session.flash = session.flash, []
        return Reply(200, self._page(app, session, rest, messages=messages))

    def _login_page(
        self,
        app: App,
        session: auth.Session | None,
        *,
        page: str = scope.PAGES[0],
        expired: bool = False,
        errors: list[str] | None = None,
        status: int = 200,
    ) -> Reply:
        """The login form, under the login form's session (a new one when ``session`` is
        None), leading to ``page``."""
        fresh = session if session is not None else app.sessions.start(None)
        said = ["Your session has expired or ended: log in again."] if expired else []
        body = pages.login(fresh.csrf, page)
        html = document("Log in", body, errors=[*said, *(errors or [])])
        return Reply(status, html, cookies=[self._cookie(app, fresh, scope.LOGIN)])

    def _page(
        self,
        app: App,
        session: auth.Session,
        path: str,
        *,
        messages: list[str] | None = None,
        errors: list[str] | None = None,
    ) -> str:
        csrf, base = session.csrf, scope.base(session.prefix)
        with app.store.reading() as conn:
            n = board.counts(conn)
            if path == "/approvals":
                body = pages.approvals(board.pending(conn, app.store.clock()), csrf, base)
            elif path == "/ambiguous":
                body = pages.ambiguous(board.ambiguous(conn), csrf, base)
            elif path == "/receipts":
                body = pages.receipts(*board.receipts(conn))
            elif path == "/freeze":
                body = pages.freeze(board.freezes(conn), csrf, base)
            else:
                body = ""
        return document(
            PAGES.get(path, "Not found"),
            body,
            here=path,
            operator=session.operator,
            csrf=csrf,
            base=base,
            counts={"pending": n.pending, "ambiguous": n.ambiguous, "frozen": n.frozen},
            messages=messages or [],
            errors=errors or [],
        )

    # -- POST ----------------------------------------------------------------------------------

    def _post(self, app: App, path: str, form: dict[str, str] | None) -> Reply:
        refusal = self._origin_refusal(app)
        if refusal is not None:
            return self._refused(refusal)
        if form is None:
            return self._refused("a form is expected (application/x-www-form-urlencoded)")
        if any(forms.CONTROL.search(value) for value in form.values()):
            # No operator types one; PostgreSQL refuses NUL, which would read as a ledger down.
            return self._refused("the form holds a control character", 400)
        prefix, rest = scope.split(path)
        session, _ = self._session(app, prefix)
        if session is None:
            if path == scope.LOGIN:
                return self._login_page(
                    app, None, errors=["The login form expired: try again."], status=403
                )
            return self._login_page(app, None, expired=True, status=401)
        if not session.csrf_ok(form.get("csrf")):
            return self._refused("the form's security token is missing or wrong")
        if prefix is None:  # the login form's session: it can only log in
            return self._login(app, session, form)
        if rest == "/logout":
            app.sessions.end(session.sid)
            return redirect(scope.LOGIN, [self._cookie(app, None, scope.base(prefix))])
        return self._act(app, session, rest, form)

    def _origin_refusal(self, app: App) -> str | None:
        origin = self.headers.get("Origin")
        own = f"{app.scheme}://{self.headers.get('Host', '')}"
        if origin is not None and origin not in ("null", own, app.public_origin):
            return f"a form from another site ({origin}) is not accepted here"
        site = self.headers.get("Sec-Fetch-Site")
        if site is not None and site not in ("same-origin", "none"):
            return f"a form from another site ({site}) is not accepted here"
        return None

    def _refused(self, why: str, status: int = 403) -> Reply:
        text = f"Refused: {why}. Nothing was changed; reload the page and try again."
        return Reply(status, document("Refused", "", errors=[text]))

    def _login(self, app: App, session: auth.Session, form: Mapping[str, str]) -> Reply:
        name, token = form.get("operator", ""), form.get("token", "")
        key, page = name if name in app.tokens else "", scope.landing(form.get("next", ""))
        if not app.login_gate.enter(key):
            log.info("console: a login as %r was refused: another is being checked", key or "?")
            said = "Another login as this operator is being checked: wait a second, try again."
            return self._login_page(app, session, page=page, errors=[said], status=429)
        try:
            if not token or not auth.token_matches(app.tokens, name, token):
                time.sleep(app.login_delay)
                log.info("console: a login as %r was refused", key or "?")
                said = "Wrong operator or token."
                return self._login_page(app, session, page=page, errors=[said], status=401)
        finally:
            app.login_gate.leave(key)
        app.sessions.end(session.sid)
        fresh = app.sessions.start(name)
        log.info("console: %s logged in", name)
        # Its cookie under its own prefix only; the login form's, and any left at Path=/ (by
        # another server on this host, or an older console), cleared.
        base = scope.base(fresh.prefix)
        cookies = [self._cookie(app, fresh, base), self._cookie(app, None, scope.LOGIN)]
        cookies.append(self._cookie(app, None, "/"))
        return redirect(base + page, cookies)

    def _act(self, app: App, session: auth.Session, path: str, form: Mapping[str, str]) -> Reply:
        who = session.operator
        assert who is not None
        back = {"/approvals/answer": "/approvals", "/ambiguous/settle": "/ambiguous"}.get(path)
        back = back or ("/freeze" if path in ("/freeze", "/unfreeze") else None)
        if back is None:
            return Reply(404, self._page(app, session, path, errors=[f"nothing to do at {path}"]))
        try:
            said = self._do(app, path, form, who)
        except StoreError as exc:
            return Reply(503, self._page_or_bare(app, session, back, str(exc)))
        except CTRLRunError as exc:
            status = 400 if isinstance(exc, InvalidArgument) else 409
            return Reply(status, self._page(app, session, back, errors=[str(exc)]))
        log.info("console: %s: %s", who, one_line(said))
        session.flash.append(said)
        return redirect(scope.base(session.prefix) + back)

    def _page_or_bare(self, app: App, session: auth.Session, path: str, why: str) -> str:
        try:
            return self._page(app, session, path, errors=[why])
        except StoreError:
            return document("Unavailable", "", errors=[why])

    @staticmethod
    def _do(app: App, path: str, form: Mapping[str, str], who: str) -> str:
        if path == "/approvals/answer":
            decision = form.get("decision", "")
            if decision not in ("approve", "deny"):
                raise InvalidArgument("say approve or deny")
            grant = decision == "approve"
            return acts.decide(app.store, form.get("request_id", ""), grant=grant, operator=who)
        if path == "/ambiguous/settle":
            key, state = form.get("effect_key", ""), form.get("state", "")
            return acts.settle(app.store, key, state, form.get("note", ""), operator=who)
        if path == "/freeze":
            action, reason = form.get("action", ""), form.get("reason", "")
            return acts.freeze(app.store, action, reason, operator=who, known=app.actions)
        return acts.unfreeze(app.store, form.get("scope", ""), operator=who)
