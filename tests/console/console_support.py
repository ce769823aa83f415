"""A real console on 127.0.0.1 over a real SQLite ledger, and a browser-less client for it."""

from __future__ import annotations

import ipaddress
import re
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import ctrlrun
from ctrlrun import Control, Policy
from ctrlrun.console import ConsoleServer, ConsoleSettings, build
from ctrlrun.store import StateStore, open_store

TOKENS = {"alice": "alice-token-3f9c2a7e51", "bob": "bob-token-81d0c4e6b2"}
ENV = {"CONSOLE_ALICE": TOKENS["alice"], "CONSOLE_BOB": TOKENS["bob"]}
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: approve
  ops.push:
    effect: "push:{n}"
    decision: allow
operators:
  alice: {token_env: CONSOLE_ALICE}
  bob: {token_env: CONSOLE_BOB}
"""
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass
class Ledger:
    """The policy, the ledger file and an SDK ``Control`` that writes to it."""

    policy: Path
    url: str
    control: Control

    def store(self) -> StateStore:
        return open_store(self.url, create=False)

    def ask_approval(self, payment_id: str, amount: int = 5000) -> str:
        """An agent's refund that needs approval: the request id it is answered with."""

        @ctrlrun.protect("stripe.refund", control=self.control)
        def refund(payment_id: str, amount: int) -> str:
            return "done"

        try:
            with ctrlrun.context(agent="refund-bot"):
                refund(payment_id=payment_id, amount=amount)
        except ctrlrun.ApprovalRequired as exc:
            return str(exc.request_id)
        raise AssertionError("no approval was required")

    def make_ambiguous(self, n: int) -> str:
        """An effect whose function raised after it may have acted: ambiguous."""

        @ctrlrun.protect("ops.push", control=self.control)
        def push(n: int) -> None:
            raise ConnectionResetError("the remote hung up")

        try:
            with ctrlrun.context(agent="push-bot"):
                push(n=n)
        except Exception:  # the function's own error, re-raised; the record is ambiguous
            pass
        return f"push:{n}"


def new_ledger(tmp: Path, policy_text: str = POLICY, url: str | None = None) -> Ledger:
    """A policy and a new ledger (a SQLite file in ``tmp`` unless ``url`` names another)."""
    tmp.mkdir(parents=True, exist_ok=True)
    policy = tmp / "ctrlrun.yaml"
    policy.write_text(policy_text)
    url = url or f"sqlite:///{tmp / 'state.db'}"
    return Ledger(policy, url, Control(Policy.from_file(policy), open_store(url)))


@contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh PostgreSQL database on 127.0.0.1:5432, dropped afterwards (else a skip)."""
    import psycopg

    try:
        psycopg.connect(PG_ADMIN, connect_timeout=2).close()
    except psycopg.Error:
        pytest.skip("PostgreSQL is not answering on 127.0.0.1:5432 (user postgres, db test)")
    name = f"ctrlrun_console_{secrets.token_hex(6)}"
    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def self_signed(into: Path) -> Path:
    """A certificate for 127.0.0.1 and its key, in one PEM file."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    pem = into / "console.pem"
    pem.write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return pem


@contextmanager
def running(ledger: Ledger, **settings: object) -> Iterator[ConsoleServer]:
    """The console, serving in a thread until the block ends."""
    server = build(
        ConsoleSettings(
            listen="127.0.0.1:0",
            store_url=ledger.url,
            policy=str(ledger.policy),
            login_delay=0.0,
            **settings,  # type: ignore[arg-type]
        ),
        environ=ENV,
    )
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()
        server.app.store.close()


def client(server: ConsoleServer) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=10, trust_env=False, follow_redirects=False)


def csrf_of(html: str) -> str:
    found = CSRF.search(html)
    assert found, html[:500]
    return found.group(1)


def login(c: httpx.Client, name: str = "alice", token: str | None = None) -> str:
    """Log in; return the session's CSRF token (read from the page it lands on). The client's
    base URL then names the session's secret prefix (``/s/...``), as the browser's address
    bar does: ``c.get("/approvals")`` asks for the session's page, where its cookie goes."""
    c.base_url = c.base_url.copy_with(path="/")
    form = c.get("/login")
    assert form.status_code == 200
    done = c.post(
        "/login",
        data={"csrf": csrf_of(form.text), "operator": name, "token": token or TOKENS[name]},
    )
    assert done.status_code == 303, done.text
    where = done.headers["location"]
    assert where.startswith("/s/") and where.endswith("/approvals"), where
    c.base_url = c.base_url.copy_with(path=where.removesuffix("/approvals"))
    page = c.get("/approvals")
    assert page.status_code == 200
    return csrf_of(page.text)


def prefix_of(c: httpx.Client) -> str:
    """The base path (``/s/...``) of the session the client logged in last."""
    path = c.base_url.path.rstrip("/")
    assert path.startswith("/s/"), path
    return path
