"""Writes to a ``profile: http`` route that a server may read otherwise than ctrlrun does,
sent through a real sidecar to a real HTTP server that records what reaches it.

The policy allows a charge of at most 1000; each attack carries an amount ctrlrun would read
as small and the server as 900000. Each one must be refused with a receipt, nothing
forwarded; the plain charge still goes through.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from billing_support import Billing, billing_sidecar, receipts
from harness import Sidecar

pytestmark = pytest.mark.timeout(120)

# Formatted by the harness: braces are doubled.
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  billing.charge:
    rules:
      - when: {{amount_lte: 1000}}
        decision: allow
      - when: {{amount_eq: "5"}}
        decision: allow
      - decision: deny
upstreams:
  billing:
    profile: http
    url: http://127.0.0.1:PORT
    routes:
      - {{method: POST, path: "/v1/charges", action: billing.charge}}
"""


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[Sidecar, Billing]]:
    with billing_sidecar(tmp_path, POLICY) as both:
        yield both


JSON = ("Content-Type", "application/json")
FORM = ("Content-Type", "application/x-www-form-urlencoded")
# A form (amount=5) and a JSON object (amount 900000) at once.
BOTH = b'{"=":"&amount=5&b=","amount":900000}'
ATTACKS = [
    # Go's encoding/json and ASP.NET read keys without regard to case, the last one winning.
    ("/v1/charges", [JSON], b'{"amount":1,"Amount":900000}'),
    # Two Content-Types: Go reads the first (JSON), ctrlrun read the last (a form).
    ("/v1/charges", [JSON, FORM], BOTH),
    ("/v1/charges", [FORM, JSON], BOTH),
    # A query beside the body: Flask's request.values reads the query first.
    ("/v1/charges?amount=900000", [FORM], b"amount=5"),
    ("/v1/charges?amount=900000", [JSON], b'{"amount":5}'),
    # A method override in the body: Rails, Laravel and Symfony run this POST as a DELETE.
    ("/v1/charges", [FORM], b"amount=5&_method=DELETE"),
    ("/v1/charges", [JSON], b'{"amount":5,"_method":"DELETE"}'),
    # A charset ctrlrun does not read: in UTF-7 "+AF8-" is "_".
    ("/v1/charges", [("Content-Type", f"{FORM[1]}; charset=utf-7")], b"amount=5"),
]


@pytest.mark.parametrize(("target", "headers", "body"), ATTACKS)
def test_a_write_the_server_may_read_otherwise_is_refused_unforwarded(
    rig: tuple[Sidecar, Billing], target: str, headers: list[tuple[str, str]], body: bytes
) -> None:
    sc, billing = rig
    url = f"http://127.0.0.1:{billing.port}{target}"
    with httpx.Client(proxy=sc.proxy_url, trust_env=False, timeout=30) as http:
        got = http.post(url, content=body, headers=headers)
        assert got.status_code >= 400, got.text
        assert got.headers["x-ctrlrun-outcome"] == "invalid_request", got.text
        assert billing.received == []
        plain = http.post(
            f"http://127.0.0.1:{billing.port}/v1/charges",
            content=b'{"amount":700}',
            headers=[JSON],
        )
        assert plain.status_code == 200, plain.text
    assert [json.loads(b) for _, _, b in billing.received] == [{"amount": 700}]
    assert receipts(sc) == [("billing.invalid", "denied"), ("billing.charge", "committed")]


OPEN_POLICY = """\
schema: ctrlrun.policy/v2
actions:
  billing.charge:
    decision: deny
  billing.send:
    effect: "send:{{invoice_id}}"
    decision: allow
upstreams:
  billing:
    profile: http
    url: http://127.0.0.1:PORT
    unmapped_writes: allow
    routes:
      - {{method: POST, path: "/v1/charges", action: billing.charge}}
      - {{method: POST, path: "/v1/invoices/{{invoice_id}}/send", action: billing.send}}
"""


@pytest.fixture
def open_rig(tmp_path: Path) -> Iterator[tuple[Sidecar, Billing]]:
    with billing_sidecar(tmp_path, OPEN_POLICY) as both:
        yield both


def test_a_path_a_server_may_read_as_a_route_is_not_an_unmapped_write(
    open_rig: tuple[Sidecar, Billing],
) -> None:
    # Under unmapped_writes: allow, a denied route's path spelt as ASP.NET (any case), Rails
    # ('.json') or IIS ('\\' for '/') still reads it would be forwarded as an unmapped write.
    sc, billing = open_rig
    base = f"http://127.0.0.1:{billing.port}"
    with httpx.Client(proxy=sc.proxy_url, trust_env=False, timeout=30) as http:
        for path in ("/V1/Charges", "/v1/charges.json", "/v1/CHARGES/", "/v1%5Ccharges"):
            got = http.post(base + path, content=b"amount=5", headers=[FORM])
            assert got.headers["x-ctrlrun-outcome"] == "invalid_request", (path, got.text)
        assert billing.received == []
        # A ';' parameter would make another effect key of one invoice (Spring drops it).
        assert http.post(base + "/v1/invoices/in_1/send").status_code == 200
        again = http.post(base + "/v1/invoices/in_1;x/send")
        assert again.headers["x-ctrlrun-outcome"] == "invalid_request", again.text
        # Frameworks that route by X-Original-URL would run the denied charge.
        moved = http.post(base + "/v1/other", headers=[("X-Original-URL", "/v1/charges")])
        assert moved.headers["x-ctrlrun-outcome"] == "invalid_request", moved.text
        # A truly unmapped write still goes, as the upstream allows.
        assert http.post(base + "/v1/other", content=b"a=1", headers=[FORM]).status_code == 200
    assert [path for _, path, _ in billing.received] == ["/v1/invoices/in_1/send", "/v1/other"]
