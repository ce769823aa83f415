"""The built-in routes of ``profile: stripe``: v1 writes with form-encoded bodies."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from .route_values import (
    BadInput,
    Mapped,
    Request,
    RouteResult,
    Unmapped,
    check_arguments,
    check_body,
    match_path,
    media_type,
    shown,
    unquote_strict,
)

FORM = "application/x-www-form-urlencoded"

ROUTES: tuple[tuple[str, str, str], ...] = (
    ("POST", "/v1/refunds", "stripe.refund"),
    # The legacy endpoints move money back too: one action, whichever path carries it.
    ("POST", "/v1/charges/{charge}/refund", "stripe.refund"),
    ("POST", "/v1/charges/{charge}/refunds", "stripe.refund"),
    ("POST", "/v1/payouts", "stripe.payout"),
    ("POST", "/v1/charges", "stripe.charge"),
    ("POST", "/v1/payment_intents/{payment_intent}/cancel", "stripe.cancel_payment_intent"),
    ("DELETE", "/v1/customers/{customer}", "stripe.delete_customer"),
)
# Writes that make a refund by another road (with the field that makes it one, None: always).
# ctrlrun decides a refund only as ``stripe.refund``, so these are refused even where
# unmapped writes are allowed: forwarded, they would refund past the policy and the ledger.
REFUND_ROADS: tuple[tuple[str, str, str | None], ...] = (
    # A credit note on a paid invoice creates a refund of its charge for ``refund_amount``.
    ("POST", "/v1/credit_notes", "refund_amount"),
    # An in-person refund (Interac) through a Terminal reader.
    ("POST", "/v1/terminal/readers/{reader}/refund_payment", None),
)

_KEY = re.compile(r"([^\[\]]+)((?:\[[^\[\]]*\])*)\Z")
_PART = re.compile(r"\[([^\[\]]*)\]")
_DIGITS = re.compile(r"[0-9]+\Z")
_MAX_DEPTH = 5
# Names ctrlrun adds; a body that sets them would choose the key.
_ALIASES = ("payment_id", "account")
_ACCOUNT = re.compile(r"acct_[A-Za-z0-9]{1,64}\Z")
OWN_ACCOUNT = "self"  # ``account`` when no Stripe-Account names a connected one
# Headers that say who acts, on which account, under which key or API version: sent twice,
# which one Stripe reads is not ours to guess, and ctrlrun would decide on the other.
IDENTITY_HEADERS = frozenset(
    {"authorization", "idempotency-key", "stripe-account", "stripe-context", "stripe-version"}
)


def map_stripe(request: Request, segments: list[str]) -> RouteResult:
    """Map a Stripe write onto its action, or say why not."""
    for method, template, action in ROUTES:
        params = match_path(template, segments)
        if params is None or method != request.method:
            continue
        check_body(request)
        check_headers(request)
        arguments = _fields(request)
        for name, value in params.items():
            if arguments.setdefault(name, value) != value:
                raise BadInput(f"the path says {name}={value!r} but the body says otherwise")
        for alias in _ALIASES:
            if alias in arguments:
                raise BadInput(f"{alias!r} is not a Stripe field; ctrlrun derives it")
        arguments["account"] = account(request)
        if action == "stripe.refund":
            _add_payment_id(arguments)
        check_arguments(arguments)
        return Mapped(action, arguments)
    _refuse_other_refunds(request, segments)
    return Unmapped(f"no Stripe route maps {request.method} {shown(request.path)}")


def _refuse_other_refunds(request: Request, segments: list[str]) -> None:
    for method, template, field in REFUND_ROADS:
        if method != request.method or match_path(template, segments) is None:
            continue
        if field is not None:
            check_body(request)
            if field not in _fields(request):
                continue
        given = f" with {field}" if field else ""
        link = " (then link it to the credit note with refunds[0][refund])" if field else ""
        raise BadInput(
            f"{method} {template}{given} makes a refund, which ctrlrun decides only as "
            f"POST /v1/refunds (stripe.refund): refund there{link}"
        )


def check_headers(request: Request) -> None:
    """Refuse identity-bearing headers Stripe could read otherwise than ctrlrun does."""
    for name in sorted(IDENTITY_HEADERS & request.repeated):
        raise BadInput(f"the header {name} is sent more than once")
    for name in request.headers:
        # Rack-style servers read '_' as '-': Idempotency_Key would be a second key.
        if "_" in name and name.replace("_", "-") in IDENTITY_HEADERS:
            raise BadInput(f"the header {shown(name)} would be read as {name.replace('_', '-')}")
    if "idempotency-key" in request.headers and not request.headers["idempotency-key"].strip():
        raise BadInput("the Idempotency-Key header is empty")


def account(request: Request) -> str:
    """The account the write acts on: the connected account Stripe-Account names, else
    ``self`` (the API key's own); part of every Stripe action, so of its hash and approvals."""
    if "stripe-context" in request.headers:
        # Another way to name the account acted on; ctrlrun decides on Stripe-Account only.
        raise BadInput("ctrlrun does not read Stripe-Context; name the account in Stripe-Account")
    value = request.headers.get("stripe-account")
    if value is None:
        return OWN_ACCOUNT
    if not _ACCOUNT.match(value.strip()):
        raise BadInput(f"Stripe-Account {shown(value, 80)} is not an account id (acct_…)")
    return value.strip()


def _add_payment_id(arguments: dict[str, Any]) -> None:
    # A refund names one of them in practice; a customer-balance refund names neither, and
    # then an effect template that needs payment_id is refused where it is resolved. A charge
    # alone is resolved to its payment intent before the key is (``stripe_payments``).
    if "payment_intent" in arguments and "charge" in arguments:
        raise BadInput("a refund names its payment_intent or its charge, not both")
    for source in ("payment_intent", "charge"):
        value = arguments.get(source)
        if isinstance(value, str) and value:
            arguments["payment_id"] = value
            return


def _fields(request: Request) -> dict[str, Any]:
    """The form body (and any query parameters) as nested plain values."""
    pairs = list(_query_pairs(request))
    if request.body:
        kind = media_type(request.headers)
        if kind != FORM:
            raise BadInput(f"Stripe v1 bodies are {FORM}, not {shown(kind or 'untyped')}")
        pairs.extend(parse_form(request.body))
    tree: dict[str, Any] = {}
    for key, value in pairs:
        _insert(tree, key, value)
    fields = {key: _listify(value) for key, value in tree.items()}
    metadata = fields.get("metadata")
    if metadata == "":
        fields["metadata"] = {}  # "metadata=" clears it: an empty mapping
    elif metadata is not None and not isinstance(metadata, dict):
        raise BadInput("metadata must be given as metadata[key]=value")
    for key, value in fields.items():
        if key == "amount" or key.endswith("_amount"):
            fields[key] = _amount(key, value)
    return fields


def _query_pairs(request: Request) -> Iterator[tuple[str, str]]:
    # Stripe clients put write parameters in the body; one in the query still reaches Stripe,
    # so it is read too, and a name given in both places is refused below as a duplicate.
    for key, values in request.query.items():
        for value in values:
            if ";" in key or ";" in value:
                # Rack before 3 splits a query on ';' as on '&': "a=1;amount=9" is two fields.
                raise BadInput(f"the query parameter {shown(key, 40)} holds a ';'")
            yield key, value


def parse_form(body: bytes) -> Iterator[tuple[str, str]]:
    """Decode an ``application/x-www-form-urlencoded`` body strictly."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput("the form body is not valid UTF-8") from exc
    for part in text.split("&"):
        if "=" not in part:
            raise BadInput(f"the form field {shown(part)} has no '='")
        raw_key, raw_value = part.split("=", 1)
        key = unquote_strict(raw_key, plus=True)
        if not key:
            raise BadInput("a form field has an empty name")
        yield key, unquote_strict(raw_value, plus=True)


def _insert(tree: dict[str, Any], key: str, value: str) -> None:
    """Place ``a[b][c]=v`` at tree["a"]["b"]["c"]; ``a[]=v`` appends to a list."""
    match = _KEY.match(key)
    if match is None:
        raise BadInput(f"the form field name {shown(key)} has unbalanced brackets")
    name, parts = match.group(1), _PART.findall(match.group(2))
    if len(parts) > _MAX_DEPTH:
        raise BadInput(f"the form field name {shown(key)} nests too deeply")
    if "" in parts[:-1]:
        raise BadInput(f"the form field name {shown(key)} has '[]' before its end")
    node = tree
    for part in parts:
        child = node.setdefault(name, [] if part == "" else {})
        if part == "":
            if not isinstance(child, list):
                raise BadInput(f"the form field {shown(key)} mixes a list with other forms")
            child.append(value)
            return
        if not isinstance(child, dict):
            raise BadInput(f"the form field {shown(key)} conflicts with another field")
        node, name = child, part
    if name in node:
        # Stripe's parser keeps one of the two; which one is not ours to guess.
        raise BadInput(f"the form field {shown(key)} is given more than once")
    node[name] = value


def _listify(value: Any) -> Any:
    """``expand[0]=a&expand[1]=b`` (stripe-python's form) equals ``expand[]=a&expand[]=b``."""
    if isinstance(value, list):
        return [_listify(item) for item in value]
    if not isinstance(value, dict):
        return value
    items = {key: _listify(item) for key, item in value.items()}
    indexes = [str(index) for index in range(len(items))]
    if items and set(items) == set(indexes):
        return [items[index] for index in indexes]
    return items


def _amount(key: str, value: Any) -> int:
    # Money is integer minor units: "12.5", "1e3", "-5", "+5" and " 5" are all refused.
    if not isinstance(value, str) or not _DIGITS.match(value):
        raise BadInput(f"{key} must be a non-negative integer in minor units, got {value!r}")
    if len(value) > 18:
        raise BadInput(f"{key} {value[:24]}… is too large")
    return int(value)
