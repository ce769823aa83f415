"""The console's requests: who may see what, which POST may change what, and the answers.

Every request is checked in this order: the ``Host`` it names (a console on loopback answers
only to its own names, so a DNS-rebinding page cannot reach it), then for a POST where it comes
from (``Origin`` and ``Sec-Fetch-Site``, when the browser sends them, must be the console's
own), the session cookie, and the form's CSRF token. A POST that fails any check is refused
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
from urllib.parse import parse_qs, urlsplit

from ctrlrun.errors import CTRLRunError, InvalidArgument, StoreError
from ctrlrun.store import StateStore

from . import acts, auth, board, pages
from .html import CSS, document

if TYPE_CHECKING:
    from .server import ConsoleServer

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024  # bytes of a form
CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # all but tab and line ends
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
PAGES = {"/approvals": "Approvals", "/ambiguous": "Ambiguous effects"}
PAGES |= {"/receipts": "Receipts", "/freeze": "Freeze"}


@dataclass
class Reply:
    """An answer: status, body, and the headers beyond the security ones."""

    status: int
    body: str = ""
    content_type: str = "text/html; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)


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


def redirect(to: str, **headers: str) -> Reply:
    return Reply(303, "", headers={"Location": to, **headers})


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
        form = self._form()  # read first: a body left unread would be taken for a request
        if self._serving():
            self._run(lambda app, path: self._post(app, path, form))

    def _serving(self) -> bool:
        """Whether this connection still holds its slot, now that its request has arrived
        (while it waited, a new connection may have closed it to take its slot)."""
        if self.server.serving(self.connection):
            return True
        self.close_connection = True
        return False

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # The method and path only: never the query, never a header (cookies stay out).
        path = urlsplit(getattr(self, "path", "") or "").path  # unset: an unreadable request
        log.info("%s %s %s %s", self.address_string(), self.command or "-", path or "-", code)

    def log_message(self, format: str, *args: Any) -> None:
        log.info("%s %s", self.address_string(), format % args)

    # -- plumbing ----------------------------------------------------------------------------

    def _run(self, route: Callable[[App, str], Reply]) -> None:
        app = self.server.app
        path = urlsplit(self.path).path
        try:
            reply = self._host_refusal(app) or route(app, path)
        except StoreError as exc:  # the ledger is down or lost: say so (its URL hides passwords)
            log.error("console: %s %s: %s", self.command, path, exc)
            reply = Reply(503, document("Unavailable", "", errors=[str(exc)]))
        except Exception as exc:  # a bug: a page, a log line, no traceback out
            where = "; ".join(
                f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}"
                for f in traceback.extract_tb(exc.__traceback__)[-3:]
            )
            log.error(
                "console: %s %s failed: %s at %s", self.command, path, type(exc).__name__, where
            )
            reply = Reply(500, document("Error", "", errors=["The console failed; see its log."]))
        self._send(reply)

    def _send(self, reply: Reply) -> None:
        body = reply.body.encode("utf-8")
        self.send_response(reply.status)
        for name, value in {**HEADERS, **reply.headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _host_refusal(self, app: App) -> Reply | None:
        host = self.headers.get("Host", "")
        if app.hosts is None or host.lower() in app.hosts:
            return None
        return Reply(421, "this console does not answer to that host name\n", "text/plain")

    def _session(self, app: App) -> tuple[auth.Session | None, bool]:
        """The request's live session, and whether it presented a cookie at all."""
        sid = auth.session_id(self.headers.get("Cookie"))
        return app.sessions.get(sid), sid is not None

    def _cookie(self, app: App, session: auth.Session) -> dict[str, str]:
        return {"Set-Cookie": auth.cookie_header(session.sid, secure=app.secure_cookie)}

    # -- GET -----------------------------------------------------------------------------------

    def _get(self, app: App, path: str) -> Reply:
        if path == "/console.css":  # no data in it: the login page needs it too
            return Reply(200, CSS, "text/css; charset=utf-8")
        if path == "/favicon.ico":  # asked for by every browser: nothing, without a session
            return Reply(204)
        session, had_cookie = self._session(app)
        if path == "/login":
            return self._login_page(app, session, expired="expired" in (urlsplit(self.path).query))
        if session is None or session.operator is None:
            return redirect("/login?expired" if had_cookie and session is None else "/login")
        if path == "/":
            return redirect("/approvals")
        if path not in PAGES:
            return Reply(404, self._page(app, session, path, errors=[f"no page {path}"]))
        messages, session.flash = session.flash, []
        return Reply(200, self._page(app, session, path, messages=messages))

    def _login_page(
        self,
        app: App,
        session: auth.Session | None,
        *,
        expired: bool = False,
        errors: list[str] | None = None,
        status: int = 200,
    ) -> Reply:
        if session is not None and session.operator is not None:
            return redirect("/approvals")
        fresh = session if session is not None else app.sessions.start(None)
        said = ["Your session has expired or ended: log in again."] if expired else []
        body = pages.login(fresh.csrf)
        html = document("Log in", body, errors=[*said, *(errors or [])])
        return Reply(status, html, headers=self._cookie(app, fresh))

    def _page(
        self,
        app: App,
        session: auth.Session,
        path: str,
        *,
        messages: list[str] | None = None,
        errors: list[str] | None = None,
    ) -> str:
        csrf = session.csrf
        with app.store.reading() as conn:
            n = board.counts(conn)
            if path == "/approvals":
                body = pages.approvals(board.pending(conn, app.store.clock()), csrf)
            elif path == "/ambiguous":
                body = pages.ambiguous(board.ambiguous(conn), csrf)
            elif path == "/receipts":
                body = pages.receipts(*board.receipts(conn))
            elif path == "/freeze":
                body = pages.freeze(board.freezes(conn), csrf)
            else:
                body = ""
        return document(
            PAGES.get(path, "Not found"),
            body,
            here=path,
            operator=session.operator,
            csrf=csrf,
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
        if any(CONTROL.search(value) for value in form.values()):
            # No operator types one; PostgreSQL refuses NUL, which would read as a ledger down.
            return self._refused("the form holds a control character", 400)
        session, _ = self._session(app)
        if session is None:
            if path == "/login":
                return self._login_page(
                    app, None, errors=["The login form expired: try again."], status=403
                )
            return self._login_page(app, None, expired=True, status=401)
        if not session.csrf_ok(form.get("csrf")):
            return self._refused("the form's security token is missing or wrong")
        if path == "/login":
            return self._login(app, session, form)
        if session.operator is None:
            return self._login_page(app, session, errors=["Log in first."], status=401)
        if path == "/logout":
            app.sessions.end(session.sid)
            cleared = auth.cookie_header("", secure=app.secure_cookie, max_age=0)
            return redirect("/login", **{"Set-Cookie": cleared})
        return self._act(app, session, path, form)

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

    def _form(self) -> dict[str, str] | None:
        kind = self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True  # the body is not read: nothing else on this connection
            return None
        raw = self.rfile.read(length).decode("utf-8", errors="replace")
        if kind != "application/x-www-form-urlencoded":
            return None
        try:
            fields = parse_qs(raw, keep_blank_values=True, max_num_fields=20)
        except ValueError:
            return None
        return {k: v[0] for k, v in fields.items()}

    def _login(self, app: App, session: auth.Session, form: Mapping[str, str]) -> Reply:
        name, token = form.get("operator", ""), form.get("token", "")
        key = name if name in app.tokens else ""
        if not app.login_gate.enter(key):
            log.info("console: a login as %r was refused: another is being checked", key or "?")
            said = "Another login as this operator is being checked: wait a second, try again."
            return self._login_page(app, session, errors=[said], status=429)
        try:
            if not token or not auth.token_matches(app.tokens, name, token):
                time.sleep(app.login_delay)
                log.info("console: a login as %r was refused", key or "?")
                return self._login_page(
                    app, session, errors=["Wrong operator or token."], status=401
                )
        finally:
            app.login_gate.leave(key)
        app.sessions.end(session.sid)
        fresh = app.sessions.start(name)
        log.info("console: %s logged in", name)
        return redirect("/approvals", **self._cookie(app, fresh))

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
        return redirect(back)

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
