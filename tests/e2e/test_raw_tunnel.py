"""Bytes that do not look like HTTP, sent through a tunnel to a guarded upstream, are never
relayed raw: mitmproxy would relay "\\r\\nPOST ..." untouched (it starts with no letter), and a
server that skips leading blank lines, as RFC 9112 allows and Go's (the Kubernetes API
server's) does, would run that write unguarded. They are parsed as HTTP: the guard decides or
the request is refused as malformed, and the upstream receives nothing unguarded."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from harness import Sidecar, fake_remotes, running_sidecar
from rawproxy import ByteRecorder

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  billing.send:
    decision: deny
upstreams:
  billing:
    profile: http
    url: http://127.0.0.1:{port}
    routes:
      - {{method: POST, path: "/v1/invoices/{{invoice_id}}/send", action: billing.send}}
"""


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[Sidecar, ByteRecorder]]:
    recorder = ByteRecorder()
    text = POLICY.replace("{port}", str(recorder.port))
    try:
        with (
            fake_remotes() as (stripe, kube),
            running_sidecar(tmp_path, stripe, kube, policy_text=text, in_process=True) as sc,
        ):
            yield sc, recorder
    finally:
        recorder.sock.close()


REQUEST = b"POST /v1/invoices/in_1/send HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: 0\r\n\r\n"


@pytest.mark.parametrize(
    "prefix",
    [b"\r\n", b"\r\n\r\n", b" ", b"\x00", b"\n"],
    ids=["crlf", "2crlf", "space", "nul", "lf"],
)
def test_non_http_looking_bytes_to_an_upstream_are_not_relayed_raw(
    rig: tuple[Sidecar, ByteRecorder], prefix: bytes
) -> None:
    sc, recorder = rig
    proxy = urlsplit(sc.proxy_url)
    # mitmproxy waits for the rest of a head it did not take as one: a quiet connection after
    # 3 s is the answer then (a raw relay would have reached the recorder within milliseconds).
    with socket.create_connection((proxy.hostname, proxy.port), timeout=3) as c:
        target = f"127.0.0.1:{recorder.port}".encode()
        c.sendall(b"CONNECT " + target + b" HTTP/1.1\r\nHost: " + target + b"\r\n\r\n")
        assert c.recv(4096).startswith(b"HTTP/1.1 200")
        c.sendall(prefix + REQUEST % recorder.port)
        answer = b""
        try:
            while chunk := c.recv(4096):
                answer += chunk
                if b"\r\n\r\n" in answer:
                    break
        except OSError:
            pass
    # Refused by the guard (the action is denied) or as malformed; never relayed.
    assert answer == b"" or answer.startswith((b"HTTP/1.1 4", b"HTTP/1.1 5")), answer[:200]
    assert bytes(recorder.received) == b""
