"""``profile: http`` writes that PHP, Rack, Express or ASP.NET read as another write than
ctrlrun does, sent through a real sidecar to a real HTTP server that records what reaches it.

The policy allows a charge of at most 1000; each attack carries an amount ctrlrun would read
as small and such a server as 900000, and must be refused with a receipt, nothing forwarded.
The plain charge still goes through.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from billing_support import Billing, billing_sidecar, receipts, recorder_sidecar
from harness import Sidecar
from rawproxy import ByteRecorder, exchange

pytestmark = pytest.mark.timeout(120)

# Formatted by the harness: braces are doubled.
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  billing.charge:
    rules:
      - when: {{amount_lte: 1000}}
        decision: allow
      - decision: deny
  billing.refund:
    effect: "refund:{{order}}"
    decision: allow
upstreams:
  billing:
    profile: http
    url: http://127.0.0.1:PORT
    routes:
      - {{method: POST, path: "/v1/charges", action: billing.charge}}
      - {{method: POST, path: "/v1/refunds", action: billing.refund}}
"""


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[Sidecar, Billing]]:
    with billing_sidecar(tmp_path, POLICY) as both:
        yield both


JSON = ("Content-Type", "application/json")
FORM = ("Content-Type", "application/x-www-form-urlencoded")
ATTACKS = [
    # PHP drops the spaces a name starts with: " amount" is amount, and the last one wins.
    ("/v1/charges", [FORM], b"amount=5&+amount=900000"),
    # Rack 2 and Express's qs read "[amount]" as amount; PHP, Rack and qs read amount[] so.
    ("/v1/charges", [FORM], b"amount=5&%5Bamount%5D=900000"),
    ("/v1/charges", [FORM], b"amount=5&amount%5B%5D=900000"),
    # ASP.NET reads names without regard to case, the first one winning.
    ("/v1/charges", [FORM], b"Amount=900000&amount=5"),
    # A form that is a JSON document too: Go and Node handlers that decode the body as JSON
    # whatever its Content-Type read 900000; ctrlrun's form reading gives amount=5.
    ("/v1/charges", [FORM], b'{"amount":900000,"a":"=&amount=5&b="}'),
    # ASP.NET binds a simple parameter from the query, whatever the case of its name.
    ("/v1/charges?AMOUNT=900000", [JSON], b'{"amount":5}'),
]


@pytest.mark.parametrize(("target", "headers", "body"), ATTACKS)
def test_a_write_the_server_may_read_otherwise_is_refused_unforwarded(
    rig: tuple[Sidecar, Billing], target: str, headers: list[tuple[str, str]], body: bytes
) -> None:
    sc, billing = rig
    base = f"http://127.0.0.1:{billing.port}"
    with httpx.Client(proxy=sc.proxy_url, trust_env=False, timeout=30) as http:
        got = http.post(base + target, content=body, headers=headers)
        assert got.status_code == 400, got.text
        assert got.headers["x-ctrlrun-outcome"] == "invalid_request", got.text
        assert billing.received == []
        plain = http.post(base + "/v1/charges", content=b'{"amount":700}', headers=[JSON])
        assert plain.status_code == 200, plain.text
    assert [json.loads(b) for _, _, b in billing.received] == [{"amount": 700}]
    assert receipts(sc) == [("billing.invalid", "denied"), ("billing.charge", "committed")]


def test_a_refund_under_a_query_rack_splits_on_semicolons_is_not_a_fresh_key(
    rig: tuple[Sidecar, Billing],
) -> None:
    # Rack before 3 reads "order=x;order=o1" as order o1 (the last wins): the refund of o1
    # again, which ctrlrun would key as "refund:x;order=o1".
    sc, billing = rig
    base = f"http://127.0.0.1:{billing.port}/v1/refunds"
    with httpx.Client(proxy=sc.proxy_url, trust_env=False, timeout=30) as http:
        assert http.post(base + "?order=o1").status_code == 200
        again = http.post(base + "?order=x;order=o1")
        assert again.status_code == 400, again.text
        assert again.headers["x-ctrlrun-outcome"] == "invalid_request", again.text
    assert [path for _, path, _ in billing.received] == ["/v1/refunds?order=o1"]
    assert receipts(sc) == [("billing.refund", "committed"), ("billing.invalid", "denied")]


def test_an_order_number_javascript_reads_as_the_refunded_one_is_refused(
    rig: tuple[Sidecar, Billing],
) -> None:
    # JSON.parse reads 9007199254740993 as 9007199254740992, which a Node server looks up as
    # the order "9007199254740992" (object keys are strings): the refunded order again, under
    # the effect key refund:9007199254740993 to ctrlrun.
    sc, billing = rig
    base = f"http://127.0.0.1:{billing.port}/v1/refunds"
    refunded = b'{"order":"9007199254740992"}'
    with httpx.Client(proxy=sc.proxy_url, trust_env=False, timeout=30) as http:
        first = http.post(base, content=refunded, headers=[JSON])
        assert first.status_code == 200, first.text
        again = http.post(base, content=b'{"order":9007199254740993}', headers=[JSON])
        assert again.status_code == 400, again.text
        assert again.headers["x-ctrlrun-outcome"] == "invalid_request", again.text
    assert [body for _, _, body in billing.received] == [refunded]
    assert receipts(sc) == [("billing.refund", "committed"), ("billing.invalid", "denied")]


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[tuple[Sidecar, ByteRecorder]]:
    with recorder_sidecar(tmp_path, POLICY) as both:
        yield both


@pytest.mark.parametrize("method", [b"get", b"Get", b"hEAD", b"options"])
def test_a_read_method_in_another_case_is_no_read(
    recorder: tuple[Sidecar, ByteRecorder], method: bytes
) -> None:
    # Go's ServeMux and a handler testing r.Method == "GET" are case-sensitive: "get" is
    # another method there (the send of a handler whose else branch sends), and mitmproxy
    # forwards it as spelt. It matches no route, so it is refused as an unmapped write.
    sc, upstream = recorder
    where = b"127.0.0.1:%d" % upstream.port
    head = b" http://%s/v1/charges HTTP/1.1\r\nHost: %s\r\n" % (where, where)
    got = exchange(sc.proxy_url, method + head + b"Content-Length: 0\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 403"), got[:300]
    assert b"X-Ctrlrun-Outcome: denied" in got and b"matches no route" in got, got
    assert bytes(upstream.received) == b""
    # GET as spelt is a read, and passes.
    got = exchange(sc.proxy_url, b"GET" + head + b"\r\n")
    assert got.startswith(b"HTTP/1.1 200"), got[:300]
    assert bytes(upstream.received).startswith(b"GET /v1/charges HTTP/1.1\r\n")
