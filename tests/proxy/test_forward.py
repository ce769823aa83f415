"""What the forwarder sends upstream.

How far a request got (nothing sent, sent without a status line, status known and the body
cut) is proven on the live client against real loopback servers in ``test_h1.py``.
"""

from __future__ import annotations

from ctrlrun.proxy.forward import forward_headers


def test_ctrlrun_and_hop_by_hop_headers_are_never_forwarded() -> None:
    headers = [
        ("Ctrlrun-Approval", "apr_1"),
        ("Proxy-Authorization", "Basic x"),
        ("Connection", "keep-alive"),
        ("Idempotency-Key", "k"),
        ("Authorization", "B"),
    ]
    assert forward_headers(headers) == [("Idempotency-Key", "k"), ("Authorization", "B")]
