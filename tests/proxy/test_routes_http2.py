"""``profile: http`` writes that common server frameworks read as another write than ctrlrun.

Each request here is one ctrlrun would read as a small charge (or as a fresh effect key)
while PHP, Rack, Express or ASP.NET read a large one (or a key already used): it must be
``Invalid``, and the plain forms next to it must still map.
"""

from __future__ import annotations

import pytest

from ctrlrun.proxy.config import Route, Upstream
from ctrlrun.proxy.field_names import readings
from ctrlrun.proxy.routes import Invalid, Mapped, Request, map_request

HTTP = Upstream(
    "billing",
    "http",
    "http://b:80",
    "http",
    "b",
    80,
    routes=(
        Route("POST", "/v1/charges", "billing.charge"),
        Route("POST", "/v1/orders/{order_id}/refund", "billing.refund"),
    ),
)
FORM = {"content-type": "application/x-www-form-urlencoded"}
JSON = {"content-type": "application/json"}


def post(
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    query: dict[str, list[str]] | None = None,
    path: str = "/v1/charges",
) -> Request:
    return Request("POST", path, query or {}, headers if headers is not None else FORM, body)


# --- field names a server folds into one --------------------------------------------------


@pytest.mark.parametrize(
    "request_",
    [
        post(b"amount=5&+amount=900000"),  # PHP drops leading spaces: " amount" is amount
        post(b"amount=5&%20%20amount=900000"),
        post(b"amount_cents=5&amount.cents=900000"),  # PHP: '.' and ' ' are '_'
        post(b"amount_cents=5&amount+cents=900000"),
        post(b"amount_cents=5&amount%5Bcents=900000"),  # PHP: a '[' with no ']' is '_'
        post(b"amount=5&amount%5B%5D=900000"),  # PHP, Rack, qs: amount[] is amount
        post(b"amount=5&amount%5Bx%5D=900000"),
        post(b"amount=5&%5Bamount%5D=900000"),  # Rack 2 and qs: [amount] is amount
        post(b"amount=5&amount%5D=900000"),  # Rack 2: amount] is amount
        post(b"Amount=900000&amount=5"),  # ASP.NET: names without regard to case
        post(b"amount=5", query={"AMOUNT": ["900000"]}),
        post(b"amount=5", query={"amount.": ["1"], "amount_": ["900000"]}),
        post(b"", query={"amount": ["5"], " amount": ["900000"]}),
        post(b'{"amount_cents":5}', JSON, {"amount.cents": ["900000"]}),  # Laravel merges
        post(b'{"item":{"qty":1}}', JSON, {"item[qty]": ["900"]}),  # qs merges too
        post(b"order.id=o2", path="/v1/orders/o1/refund"),  # the path's name, folded
    ],
)
def test_two_names_a_server_may_read_as_one_field_are_refused(request_: Request) -> None:
    got = map_request(HTTP, request_)
    assert isinstance(got, Invalid) and "may be one field" in got.reason, got


@pytest.mark.parametrize(
    ("request_", "arguments"),
    [
        (post(b"amount=5&note=a.b"), {"amount": "5", "note": "a.b"}),
        (post(b"to%5B%5D=a&to%5B%5D=b"), {"to[]": ["a", "b"]}),  # one name, repeated
        (post(b"item%5Bname%5D=x&item%5Bqty%5D=2"), {"item[name]": "x", "item[qty]": "2"}),
        (post(b"a.b=1"), {"a.b": "1"}),  # alone, a folded name is the other name it is
        (post(b"amount=5", query={"notify": ["no"]}), {"amount": "5", "notify": "no"}),
        (
            post(b'{"order_id":"o1"}', JSON, path="/v1/orders/o1/refund"),
            {"order_id": "o1"},
        ),
    ],
)
def test_names_that_stay_apart_still_map(request_: Request, arguments: dict[str, object]) -> None:
    action = "billing.refund" if "/orders/" in request_.path else "billing.charge"
    assert map_request(HTTP, request_) == Mapped(action, arguments)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("amount", {"amount"}),
        (" amount", {" amount", "amount"}),
        ("a.b c", {"a.b c", "a_b_c"}),
        ("a[b]", {"a[b]", "a"}),
        ("a[b", {"a[b", "a_b", "a"}),
        ("a.b[c", {"a.b[c", "a_b_c", "a.b"}),
        ("a[b.c", {"a[b.c", "a_b.c", "a_b_c", "a"}),  # PHP 7 and PHP 8
        ("[a]", {"[a]", "a"}),
        ("Amount", {"amount"}),
    ],
)
def test_readings(name: str, expected: set[str]) -> None:
    assert readings(name) == expected


# --- a form that is a JSON document too ---------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"amount":900000,"a":"=&amount=5&b="}',
        b'{"amount":900000,"x":"="}&amount=5',  # Go's json.Decoder stops after one value
        b' \r\n[{"amount":900000,"a":"=&amount=5&b="}]',
    ],
)
def test_a_form_body_that_is_json_too_is_refused(body: bytes) -> None:
    # Handlers that json-decode the body whatever its Content-Type read amount 900000.
    got = map_request(HTTP, post(body))
    assert isinstance(got, Invalid) and "JSON document too" in got.reason, got
    assert map_request(HTTP, post(b"amount=5&note=%7B")) == Mapped(
        "billing.charge", {"amount": "5", "note": "{"}
    )


# --- a ';' in the query -------------------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    [{"order": ["x;order=o1"]}, {"x;order": ["o1"]}, {"order": ["o1", "x;order=o2"]}],
)
def test_a_semicolon_in_the_query_of_a_write_is_refused(query: dict[str, list[str]]) -> None:
    # Rack before 3 splits a query on ';': "order=x;order=o1" is order o1, the last winning.
    got = map_request(HTTP, post(b"", {}, query))
    assert isinstance(got, Invalid) and "';'" in got.reason, got


# --- integers a double cannot hold --------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"order":9007199254740993}',  # 9007199254740992 to JavaScript
        b'{"order":-9007199254740993}',
        b'{"amount":1' + b"0" * 400 + b"}",  # Infinity to JavaScript
        b'{"items":[{"id":18446744073709551617}]}',
    ],
)
def test_an_integer_past_two_to_the_53_is_refused(body: bytes) -> None:
    got = map_request(HTTP, post(body, JSON))
    assert isinstance(got, Invalid) and "doubles" in got.reason, got


def test_integers_a_double_holds_exactly_still_map() -> None:
    for n in (9007199254740991, -9007199254740991, 0):
        body = b'{"order":%d}' % n
        assert map_request(HTTP, post(body, JSON)) == Mapped("billing.charge", {"order": n})
    # as a string the number is text to every server
    got = map_request(HTTP, post(b'{"order":"9007199254740993"}', JSON))
    assert got == Mapped("billing.charge", {"order": "9007199254740993"})
