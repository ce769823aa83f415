"""Requests through the sidecar written byte by byte, so every spelling of a host reaches it
as the agent wrote it (HTTP clients normalise hosts), and a recording upstream that keeps
every request's headers."""

from __future__ import annotations

import json
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TIMEOUT = 20.0


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def outcome(self) -> str | None:
        return self.headers.get("x-ctrlrun-outcome")


def _read_head(sock: socket.socket | ssl.SSLSocket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before the head ended: {data[:200]!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, rest


def _read_reply(sock: socket.socket | ssl.SSLSocket) -> Reply:
    status, headers, body = _read_head(sock)
    length = int(headers.get("content-length", "-1"))
    while length < 0 or len(body) < length:
        try:
            chunk = sock.recv(65536)
        except (ConnectionError, ssl.SSLError):
            break
        if not chunk:
            break
        body += chunk
    return Reply(status, headers, body)


def request_bytes(
    method: str,
    target: str,
    host_header: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host_header}", "Connection: close"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    if body or method not in ("GET", "HEAD"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def plain(proxy_port: int, method: str, url: str, host_header: str, **kw: Any) -> Reply:
    """An absolute-form request to the proxy (plain HTTP through ``HTTP_PROXY``)."""
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=TIMEOUT) as sock:
        sock.sendall(request_bytes(method, url, host_header, **kw))
        return _read_reply(sock)


def connect(
    proxy_port: int,
    authority: str,
    method: str,
    path: str,
    host_header: str,
    *,
    tls: ssl.SSLContext | None = None,
    sni: str | None = None,
    connect_headers: dict[str, str] | None = None,
    **kw: Any,
) -> Reply:
    """CONNECT ``authority``, then one request inside the tunnel (TLS when ``tls``)."""
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=TIMEOUT) as raw:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (connect_headers or {}).items())
        raw.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{extra}\r\n".encode())
        status, headers, _ = _read_head(raw)
        if status != 200:
            return Reply(status, headers, b"")
        sock: socket.socket | ssl.SSLSocket = raw
        if tls is not None:
            sock = tls.wrap_socket(raw, server_hostname=sni)
        try:
            sock.sendall(request_bytes(method, path, host_header, **kw))
            return _read_reply(sock)
        except (ConnectionError, ssl.SSLError, TimeoutError) as exc:
            return Reply(0, {"error": type(exc).__name__}, b"")


def client_tls(ca_file: str) -> ssl.SSLContext:
    """A client context trusting the proxy's CA, naming no host (SNI chosen per test)."""
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.check_hostname = False  # the point is to send odd SNIs; the CA is still verified
    return ctx


@dataclass
class Recorder:
    """A plain-HTTP upstream on loopback that answers 200 and keeps every request's headers."""

    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                if length:
                    self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                recorder.seen.append((self.command, self.path, headers))
                body = json.dumps({"ok": True}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def __enter__(self) -> Recorder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class ByteRecorder:
    """A TCP server on loopback that keeps every byte it is sent; with ``answer``, it answers
    each request head it sees with a 200 (else nothing). ``bind="::"`` listens on every
    address, IPv4 and IPv6, as most servers do; with ``tls`` it speaks TLS."""

    def __init__(
        self, *, answer: bool = False, bind: str = "127.0.0.1", tls: ssl.SSLContext | None = None
    ) -> None:
        self.answer, self.tls = answer, tls
        if ":" in bind:
            self.sock = socket.create_server((bind, 0), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            self.sock = socket.create_server((bind, 0))
        self.port = self.sock.getsockname()[1]
        self.received = bytearray()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        seen = 0
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except OSError:
                conn.close()
                return
        with conn:
            try:
                while data := conn.recv(65536):
                    self.received += data
                    if self.answer:
                        heads = bytes(self.received).count(b"\r\n\r\n")
                        conn.sendall(OK_HEAD * (heads - seen))
                        seen = heads
            except OSError:
                pass


def exchange(proxy_url: str, data: bytes, *, wait: float = 3.0, answers: int = 1) -> bytes:
    """Send ``data`` to the proxy on one connection; what came back once ``answers`` whole
    responses had, or before it went quiet (a keep-alive connection stays open)."""
    host, port = proxy_url.rsplit("/", 1)[1].split(":")
    got = b""
    with socket.create_connection((host, int(port)), timeout=wait) as conn:
        conn.sendall(data)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and whole_answers(got) < answers:
            try:
                chunk = conn.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            got += chunk
    return got


def whole_answers(data: bytes) -> int:
    """How many whole responses framed by ``Content-Length`` ``data`` starts with."""
    count = 0
    while (end := data.find(b"\r\n\r\n")) != -1:
        found = re.search(rb"\r\ncontent-length:\s*(\d+)\r\n", data[: end + 2], re.I)
        if found is None or len(data) < end + 4 + int(found[1]):
            break  # framed otherwise, or not all here yet: read until quiet
        count, data = count + 1, data[end + 4 + int(found[1]) :]
    return count
