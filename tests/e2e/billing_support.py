"""``profile: http`` upstreams for the attack tests, each with a sidecar in front: a real HTTP
server on loopback that answers 200 to every POST and keeps what reached it, and a raw
recorder of the bytes that reach it."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from harness import Sidecar, fake_remotes, running_sidecar
from rawproxy import ByteRecorder


class Billing:
    """An HTTP server on loopback that answers 200 and keeps every request it is sent, as
    (method, target, body)."""

    def __init__(self) -> None:
        received: list[tuple[str, str, bytes]] = []
        self.received = received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("content-length") or 0)
                received.append((self.command, self.path, self.rfile.read(size)))
                body = b'{"id":"ch_1"}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# A profile: http upstream whose one route, sending an invoice, is denied (braces doubled: the
# harness formats the policy).
DENY_SEND = """\
schema: ctrlrun.policy/v2
actions:
  billing.send:
    decision: deny
upstreams:
  billing:
    profile: http
    url: http://127.0.0.1:PORT
    routes:
      - {{method: POST, path: "/v1/invoices/{{invoice_id}}/send", action: billing.send}}
"""


@contextmanager
def billing_sidecar(tmp_path: Path, policy: str) -> Iterator[tuple[Sidecar, Billing]]:
    """A sidecar whose policy is ``policy`` with PORT replaced by the Billing server's."""
    billing = Billing()
    try:
        with _sidecar_before(tmp_path, policy, billing.port) as sc:
            yield sc, billing
    finally:
        billing.close()


@contextmanager
def recorder_sidecar(
    tmp_path: Path, policy: str, *, bind: str = "127.0.0.1", tls: ssl.SSLContext | None = None
) -> Iterator[tuple[Sidecar, ByteRecorder]]:
    """A sidecar in front of a ``ByteRecorder`` (which answers 200), for raw-wire tests."""
    upstream = ByteRecorder(answer=True, bind=bind, tls=tls)
    try:
        with _sidecar_before(tmp_path, policy, upstream.port) as sc:
            yield sc, upstream
    finally:
        upstream.sock.close()


@contextmanager
def _sidecar_before(tmp_path: Path, policy: str, port: int) -> Iterator[Sidecar]:
    """An in-process sidecar whose policy is ``policy`` with PORT replaced by ``port``."""
    policy_text = policy.replace("PORT", str(port))
    with (
        fake_remotes() as (stripe, kube),
        running_sidecar(tmp_path, stripe, kube, policy_text=policy_text, in_process=True) as sc,
    ):
        yield sc


def receipts(sc: Sidecar) -> list[tuple[str, str]]:
    """(action, result) of every receipt, in order."""
    return [(r.action, r.result) for r in sc.receipts()]
