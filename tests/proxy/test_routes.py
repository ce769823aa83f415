"""Route tables: every profile row, reads, dry runs, and bad bodies."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctrlrun.proxy.config import Route, Upstream
from ctrlrun.proxy.route_values import KubeWrite
from ctrlrun.proxy.routes import (
    MAX_BODY,
    Invalid,
    Mapped,
    PassThrough,
    Request,
    Unmapped,
    map_request,
)

STRIPE = Upstream(
    name="stripe",
    profile="stripe",
    url="https://api.stripe.com",
    scheme="https",
    host="api.stripe.com",
    port=443,
)
KUBE = Upstream(
    name="prod-eu",
    profile="kubernetes",
    url="https://10.0.0.1:6443",
    scheme="https",
    host="10.0.0.1",
    port=6443,
    cluster="eu-1",
)
KUBE_NO_CLUSTER = Upstream(
    name="prod-us", profile="kubernetes", url="https://k", scheme="https", host="k", port=443
)
HTTP = Upstream(
    name="billing",
    profile="http",
    url="http://billing.internal:8000",
    scheme="http",
    host="billing.internal",
    port=8000,
    routes=(
        Route("POST", "/v1/invoices/{invoice_id}/send", "billing.send_invoice"),
        Route("PUT", "/v1/accounts/{account}/limits/{kind}", "billing.set_limit"),
        Route("delete", "/v1/items/{item}", "billing.delete_item"),
        Route("POST", "/v1/{a}-{b}", "billing.never"),  # not whole-segment: never matches
    ),
)

FORM = {"content-type": "application/x-www-form-urlencoded"}
JSON = {"content-type": "application/json"}
MERGE = {"content-type": "application/merge-patch+json"}
SMP = {"content-type": "application/strategic-merge-patch+json"}
JPATCH = {"content-type": "application/json-patch+json"}
APPLY = {"content-type": "application/apply-patch+yaml"}
SCALE = "/apis/apps/v1/namespaces/prod/deployments/web/scale"
DEPLOY = "/apis/apps/v1/namespaces/prod/deployments/web"
NS = "/api/v1/namespaces/prod"
SCALED = {"cluster": "eu-1", "namespace": "prod", "deployment": "web"}
HUGE = b"x" * (MAX_BODY + 1)


def req(
    method: str,
    path: str,
    body: bytes | str = b"",
    headers: dict[str, str] | None = None,
    query: dict[str, list[str]] | None = None,
) -> Request:
    data = body.encode() if isinstance(body, str) else body
    return Request(method, path, query or {}, headers or {}, data)


def js(value: Any) -> bytes:
    return json.dumps(value).encode()


# --- Stripe ---------------------------------------------------------------------------------

STRIPE_MAPPED = [
    (
        req(
            "POST",
            "/v1/refunds",
            "payment_intent=pi_1&amount=500&reason=requested_by_customer&metadata[order]=7",
            FORM,
        ),
        "stripe.refund",
        {
            "payment_intent": "pi_1",
            "amount": 500,
            "reason": "requested_by_customer",
            "metadata": {"order": "7"},
            "payment_id": "pi_1",
        },
    ),
    (
        req("POST", "/v1/refunds", "charge=ch_1", FORM),
        "stripe.refund",
        {"charge": "ch_1", "payment_id": "ch_1"},
    ),
    (  # a customer-balance refund names neither: no payment_id, the template decides
        req("POST", "/v1/refunds", "customer=cus_1&origin=customer_balance&amount=5", FORM),
        "stripe.refund",
        {"customer": "cus_1", "origin": "customer_balance", "amount": 5},
    ),
    (
        req("POST", "/v1/refunds", "payment_intent=pi_1&expand[]=charge&expand[]=x", FORM),
        "stripe.refund",
        {"payment_intent": "pi_1", "expand": ["charge", "x"], "payment_id": "pi_1"},
    ),
    (  # stripe-python's own list form gives the same arguments
        req("POST", "/v1/refunds", "payment_intent=pi_1&expand[0]=charge&expand[1]=x", FORM),
        "stripe.refund",
        {"payment_intent": "pi_1", "expand": ["charge", "x"], "payment_id": "pi_1"},
    ),
    (
        req("POST", "/v1/refunds", "payment_intent=pi_1&metadata=", FORM),
        "stripe.refund",
        {"payment_intent": "pi_1", "metadata": {}, "payment_id": "pi_1"},
    ),
    (
        req("POST", "/v1/refunds", "payment_intent=pi_1&metadata%5Bnote%5D=two+words%21", FORM),
        "stripe.refund",
        {"payment_intent": "pi_1", "metadata": {"note": "two words!"}, "payment_id": "pi_1"},
    ),
    (
        req(
            "POST",
            "/v1/refunds",
            "payment_intent=pi_1",
            {"content-type": "application/x-www-form-urlencoded; charset=utf-8"},
        ),
        "stripe.refund",
        {"payment_intent": "pi_1", "payment_id": "pi_1"},
    ),
    (  # parameters in the query reach Stripe too
        req("POST", "/v1/refunds", query={"payment_intent": ["pi_q"]}),
        "stripe.refund",
        {"payment_intent": "pi_q", "payment_id": "pi_q"},
    ),
    (
        req("post", "/v1/refunds/", "payment_intent=pi_1", FORM),
        "stripe.refund",
        {"payment_intent": "pi_1", "payment_id": "pi_1"},
    ),
    (
        req("POST", "/v1/payouts", "amount=1000&currency=eur&method=instant", FORM),
        "stripe.payout",
        {"amount": 1000, "currency": "eur", "method": "instant"},
    ),
    (
        req(
            "POST",
            "/v1/charges",
            "amount=2000&currency=usd&customer=cus_1&capture=false&application_fee_amount=07"
            "&transfer_data[destination]=acct_1",
            FORM,
        ),
        "stripe.charge",
        {
            "amount": 2000,
            "currency": "usd",
            "customer": "cus_1",
            "capture": "false",
            "application_fee_amount": 7,
            "transfer_data": {"destination": "acct_1"},
        },
    ),
    (
        req("POST", "/v1/payment_intents/pi_9/cancel", "cancellation_reason=abandoned", FORM),
        "stripe.cancel_payment_intent",
        {"payment_intent": "pi_9", "cancellation_reason": "abandoned"},
    ),
    (
        req("POST", "/v1/payment_intents/pi_9/cancel", "payment_intent=pi_9", FORM),
        "stripe.cancel_payment_intent",
        {"payment_intent": "pi_9"},
    ),
    (
        req("DELETE", "/v1/customers/cus_1"),
        "stripe.delete_customer",
        {"customer": "cus_1"},
    ),
    (  # percent-decoded, so "cus%5F1" and "cus_1" are one effect
        req("DELETE", "/v1/customers/cus%5F1"),
        "stripe.delete_customer",
        {"customer": "cus_1"},
    ),
]


@pytest.mark.parametrize(("request_", "action", "arguments"), STRIPE_MAPPED)
def test_stripe_mapped(request_: Request, action: str, arguments: dict[str, Any]) -> None:
    # Without Stripe-Account every write acts on the API key's own account.
    assert map_request(STRIPE, request_) == Mapped(action, arguments | {"account": "self"})


@pytest.mark.parametrize(
    "request_",
    [
        req("POST", "/v1/customers", "email=a@b.c", FORM),
        req("POST", "/v1/refunds/re_1", "metadata[a]=b", FORM),
        req("POST", "/v1/refunds/re_1/cancel"),
        req("PUT", "/v1/refunds", "payment_intent=pi_1", FORM),
        req("DELETE", "/v1/refunds"),
        req("POST", "/v1/customers/cus_1"),
        req("POST", "/v1/payment_intents/pi_1/confirm"),
        req("POST", "/v2/core/accounts", b"{}", JSON),
        req("TRACE", "/v1/refunds"),
    ],
)
def test_stripe_unmapped(request_: Request) -> None:
    assert isinstance(map_request(STRIPE, request_), Unmapped)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("payment_intent=pi_1&amount=12.5", "amount"),
        ("payment_intent=pi_1&amount=1e3", "amount"),
        ("payment_intent=pi_1&amount=-5", "amount"),
        ("payment_intent=pi_1&amount=%2B5", "amount"),
        ("payment_intent=pi_1&amount=+5", "amount"),  # "+" is a space in a form
        ("payment_intent=pi_1&amount=", "amount"),
        ("payment_intent=pi_1&amount=abc", "amount"),
        ("payment_intent=pi_1&amount=1_000", "amount"),
        ("payment_intent=pi_1&amount=%EF%BC%95", "amount"),  # a full-width digit
        ("payment_intent=pi_1&amount=1234567890123456789", "too large"),
        ("payment_intent=pi_1&amount[x]=5", "amount"),
        ("payment_intent=pi_1&amount=5&amount=6", "more than once"),
        ("payment_intent", "no '='"),
        ("payment_intent=pi_1&&amount=5", "no '='"),
        ("payment_intent=pi_1&", "no '='"),
        ("=pi_1", "empty name"),
        ("payment_intent=pi_%zz", "percent escape"),
        ("payment_intent=pi_%FF", "UTF-8"),
        ("metadata[a=1", "brackets"),
        ("metadata]a[=1", "brackets"),
        ("metadata=foo", "metadata"),
        ("metadata[a]=1&metadata[a]=2", "more than once"),
        ("metadata[a]=1&metadata=x", "more than once"),
        ("expand[]=a&expand[0]=b", "conflicts"),
        ("expand[0]=a&expand[]=b", "mixes"),
        ("a[][b]=1", "'[]' before"),
        ("a[1][2][3][4][5][6]=x", "too deeply"),
        ("payment_intent=pi_1%0D%0AX-Evil:%201", "control character"),
        ("charge=ch%001", "control character"),
        ("payment_intent=pi_1&metadata[k%0A]=v", "control character"),
        ("payment_intent=pi_1&payment_id=pi_2", "payment_id"),
    ],
)
def test_stripe_invalid_form(body: str, fragment: str) -> None:
    result = map_request(STRIPE, req("POST", "/v1/refunds", body, FORM))
    assert isinstance(result, Invalid)
    assert fragment in result.reason


@pytest.mark.parametrize(
    "request_",
    [
        req("POST", "/v1/refunds", b"payment_intent=pi_\xff", FORM),
        req("POST", "/v1/refunds", b'{"payment_intent": "pi_1"}', JSON),
        req("POST", "/v1/refunds", b"payment_intent=pi_1"),
        req("POST", "/v1/refunds", HUGE, FORM),
        req("POST", "/v1/refunds", "payment_intent=pi_1", FORM, {"payment_intent": ["pi_2"]}),
        req("POST", "/v1/payment_intents/pi_9/cancel", "payment_intent=pi_8", FORM),
        req("DELETE", "/v1/customers/cus_1%0D%0AX-Evil:1"),
        req("DELETE", "/v1/customers/cus_1%2Fother"),
        req("DELETE", "/v1/customers/cus_%FF"),
        req("POST", "/v1//refunds", "payment_intent=pi_1", FORM),
        req("POST", "/v1/./refunds", "payment_intent=pi_1", FORM),
        req("POST", "/v1/x/../refunds", "payment_intent=pi_1", FORM),
        req("POST", "v1/refunds", "payment_intent=pi_1", FORM),
    ],
)
def test_stripe_invalid_request(request_: Request) -> None:
    assert isinstance(map_request(STRIPE, request_), Invalid)


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS"])
def test_reads_pass_through_unparsed(method: str) -> None:
    for upstream in (STRIPE, KUBE, HTTP):
        result = map_request(upstream, req(method, "/v1/refunds%FF//..", b"", FORM))
        assert isinstance(result, PassThrough)
        # A body on a read could be a second request to a server that does not read it.
        result = map_request(upstream, req(method, "/v1/refunds", b"\xff" * 10, FORM))
        assert isinstance(result, Invalid) and "with a body" in result.reason


# --- Kubernetes -----------------------------------------------------------------------------

KUBE_MAPPED = [
    (req("DELETE", NS), "k8s.delete_namespace", {"cluster": "eu-1", "name": "prod"}),
    (
        req("DELETE", NS, js({"kind": "DeleteOptions", "propagationPolicy": "Foreground"}), JSON),
        "k8s.delete_namespace",
        {"cluster": "eu-1", "name": "prod"},
    ),
    (  # a body ctrlrun cannot read is not proof of a dry run: still protected
        req(
            "DELETE",
            NS,
            b"k8s\x00\x01\x02",
            {"content-type": "application/vnd.kubernetes.protobuf"},
        ),
        "k8s.delete_namespace",
        {"cluster": "eu-1", "name": "prod"},
    ),
    (  # the apiserver ignores the query when a DeleteOptions body is present
        req("DELETE", NS, b"{}", JSON, {"dryRun": ["All"]}),
        "k8s.delete_namespace",
        {"cluster": "eu-1", "name": "prod"},
    ),
    (req("DELETE", DEPLOY), "k8s.delete_deployment", SCALED),
    (
        req("DELETE", DEPLOY, js({"propagationPolicy": "Background"}), JSON),
        "k8s.delete_deployment",
        SCALED,
    ),
]


@pytest.mark.parametrize(("request_", "action", "arguments"), KUBE_MAPPED)
def test_kubernetes_mapped(request_: Request, action: str, arguments: dict[str, Any]) -> None:
    assert map_request(KUBE, request_) == Mapped(action, arguments)


def test_kubernetes_cluster_defaults_to_upstream_name() -> None:
    result = map_request(KUBE_NO_CLUSTER, req("DELETE", NS))
    assert result == Mapped("k8s.delete_namespace", {"cluster": "prod-us", "name": "prod"})


WORKLOAD = {**SCALED, "workload": "deployment/web"}
STS = "/apis/apps/v1/namespaces/prod/statefulsets/db"
RS = "/apis/apps/v1/namespaces/prod/replicasets/web-1"
REPLICAS = {"spec": {"replicas": 6}}
OPS = [{"op": "replace", "path": "/spec/replicas", "value": 6}]
KUBE_WRITES = [
    # (request, kind, name, /scale, patch type, document)
    (req("PATCH", SCALE, js(REPLICAS), MERGE), "deployments", "web", True, "merge", REPLICAS),
    (req("PATCH", SCALE, js(REPLICAS), SMP), "deployments", "web", True, "strategic", REPLICAS),
    (
        req("PATCH", SCALE, js(REPLICAS), {"content-type": MERGE["content-type"] + "; utf-8"}),
        "deployments",
        "web",
        True,
        "merge",
        REPLICAS,
    ),
    (req("PATCH", SCALE, js(OPS), JPATCH), "deployments", "web", True, "json", OPS),
    (req("PUT", SCALE, js(REPLICAS), JSON), "deployments", "web", True, "put", REPLICAS),
    (req("PUT", SCALE, js(REPLICAS)), "deployments", "web", True, "put", REPLICAS),
    (req("PUT", DEPLOY, js(REPLICAS), JSON), "deployments", "web", False, "put", REPLICAS),
    (req("PATCH", DEPLOY, js(REPLICAS), MERGE), "deployments", "web", False, "merge", REPLICAS),
    (  # any change, directives included: the apiserver's dry run says what it does
        req("PATCH", DEPLOY, js({"spec": {"replicas": 2, "$patch": "delete"}}), SMP),
        "deployments",
        "web",
        False,
        "strategic",
        {"spec": {"replicas": 2, "$patch": "delete"}},
    ),
    (
        req(
            "PATCH",
            DEPLOY,
            "kind: Deployment\nspec: {replicas: 6}",
            APPLY,
            {"fieldManager": ["me"]},
        ),
        "deployments",
        "web",
        False,
        "apply",
        {"kind": "Deployment", "spec": {"replicas": 6}},
    ),
    (req("PATCH", DEPLOY, js(REPLICAS), APPLY), "deployments", "web", False, "apply", REPLICAS),
    (
        req("PATCH", STS + "/scale", js(REPLICAS), MERGE),
        "statefulsets",
        "db",
        True,
        "merge",
        REPLICAS,
    ),
    (req("PATCH", STS, js(REPLICAS), SMP), "statefulsets", "db", False, "strategic", REPLICAS),
    (req("PUT", RS + "/scale", js(REPLICAS), JSON), "replicasets", "web-1", True, "put", REPLICAS),
]


@pytest.mark.parametrize("dry_run", [["all"], ["All", "x"], ["All", ""]])
def test_a_dry_run_the_apiserver_would_refuse_is_refused_here(dry_run: list[str]) -> None:
    # ctrlrun asks its own question with dryRun=All added: beside another value, that
    # question could be applied (the apiserver answers 422 to anything but All).
    result = map_request(KUBE, req("PATCH", SCALE, js(REPLICAS), MERGE, {"dryRun": dry_run}))
    assert isinstance(result, Invalid) and "dryRun" in result.reason


@pytest.mark.parametrize(("request_", "kind", "name", "scale", "media", "document"), KUBE_WRITES)
def test_kubernetes_workload_writes_are_decided_on_the_dry_run(
    request_: Request, kind: str, name: str, scale: bool, media: str, document: Any
) -> None:
    result = map_request(KUBE, request_)
    singular = kind[:-1]
    arguments = {
        "cluster": "eu-1",
        "namespace": "prod",
        singular: name,
        "workload": f"{singular}/{name}",
    }
    assert result == KubeWrite(kind, "prod", name, scale, media, document, arguments)
    assert kind != "deployments" or arguments == WORKLOAD


@pytest.mark.parametrize(
    "request_",
    [
        req("GET", DEPLOY),
        req("GET", "/apis/apps/v1/namespaces/prod/deployments", query={"watch": ["true"]}),
        req("GET", "/api/v1/watch/namespaces/prod/pods"),
        req("HEAD", NS),
        req("OPTIONS", SCALE),
        req("PATCH", SCALE, js({"spec": {"replicas": 6}}), MERGE, {"dryRun": ["All"]}),
        req("PUT", SCALE, js({"spec": {"replicas": 6}}), JSON, {"dryRun": ["All"]}),
        req("PATCH", DEPLOY, js({"spec": {"template": {}}}), MERGE, {"dryRun": ["All"]}),
        req("PATCH", SCALE, b"spec: {replicas: 6}", APPLY, {"dryRun": ["All"]}),
        req("DELETE", NS, query={"dryRun": ["All"]}),
        req("DELETE", DEPLOY, js({"dryRun": ["All"]}), JSON),
    ],
)
def test_kubernetes_pass_through(request_: Request) -> None:
    assert isinstance(map_request(KUBE, request_), PassThrough)


def test_kubernetes_watch_reason() -> None:
    result = map_request(KUBE, req("GET", "/api/v1/pods", query={"watch": ["1"]}))
    assert isinstance(result, PassThrough) and "watch" in result.reason


@pytest.mark.parametrize(
    ("request_", "fragment"),
    [
        (
            req("POST", "/apis/apps/v1/namespaces/prod/deployments", b"{}", JSON),
            "no Kubernetes route",
        ),
        (req("DELETE", "/api/v1/namespaces/prod/pods/web-1"), "no Kubernetes route"),
        (req("POST", SCALE, b"{}", JSON), "no Kubernetes route"),
        (req("DELETE", SCALE), "no Kubernetes route"),
        (req("PATCH", DEPLOY + "/status", b"{}", MERGE), "no Kubernetes route"),
        (req("PATCH", NS, b"{}", MERGE), "no Kubernetes route"),
        (req("DELETE", "/api/v1/namespaces/prod/finalize"), "no Kubernetes route"),
        (req("DELETE", "/k8s/api/v1/namespaces/prod"), "no Kubernetes route"),
    ],
)
def test_kubernetes_unmapped(request_: Request, fragment: str) -> None:
    result = map_request(KUBE, request_)
    assert isinstance(result, Unmapped)
    assert fragment in result.reason


@pytest.mark.parametrize(
    ("request_", "fragment"),
    [
        (req("PATCH", SCALE, b'{"spec":{"replicas":6.0}}', MERGE), "non-integer"),
        (req("PATCH", DEPLOY, b'{"spec":{"replicas":1,"replicas":100}}', MERGE), "repeats"),
        (req("PATCH", SCALE, b'{"spec":{"replicas":NaN}}', MERGE), "NaN"),
        (req("PATCH", SCALE, b"[]", MERGE), "JSON object"),
        (req("PATCH", SCALE, b'{"spec":', MERGE), "not valid JSON"),
        (req("PATCH", SCALE, b"", MERGE), "not valid JSON"),
        (req("PATCH", SCALE, b'{"spec":{"replicas":\xff}}', MERGE), "UTF-8"),
        (req("PATCH", SCALE, b'{"op":"replace"}', JPATCH), "list of operations"),
        (req("PATCH", DEPLOY, b"spec: {replicas: 1.5}", APPLY), "float"),
        (req("PATCH", DEPLOY, b"a: 1\n---\nb: 2\n", APPLY), "exactly one"),
        (req("PATCH", DEPLOY, b"- 1\n", APPLY), "JSON object"),
        (req("PATCH", DEPLOY, b"a: [", APPLY), "YAML"),
        (
            req("PUT", SCALE, b"k8s\x00", {"content-type": "application/vnd.kubernetes.protobuf"}),
            "PUT body",
        ),
        (req("PATCH", SCALE, js({"spec": {"replicas": 6}}), JSON), "PATCH body"),
        (req("PATCH", SCALE, js({"spec": {"replicas": 6}})), "untyped"),
        (req("PATCH", SCALE, HUGE, MERGE), "at most"),
        (req("DELETE", "/api/v1/namespaces/prod%0Aevil"), "control character"),
        (req("DELETE", "/api/v1/namespaces/prod%2Fx"), "ambiguous"),
        (
            req("PATCH", "/apis/apps/v1/namespaces/prod/deployments/web%2Fscale", b"{}", MERGE),
            "ambiguous",
        ),
        # deletecollection: no object to decide on, whatever unmapped_writes says
        (req("DELETE", "/apis/apps/v1/namespaces/prod/deployments"), "collection DELETE"),
        (
            req(
                "DELETE",
                "/apis/apps/v1/namespaces/prod/statefulsets",
                query={"labelSelector": ["a=b"]},
            ),
            "one object at a time",
        ),
        # A StatefulSet's delete takes its pods: a scale to 0 and more, whatever unmapped_writes.
        (req("DELETE", STS), "removes its pods"),
        # A dry run through a proxy is the application's to honour, if it reads one at all.
        (
            req("POST", "/api/v1/namespaces/prod/services/web/proxy", query={"dryRun": ["All"]}),
            "apiserver's proxy",
        ),
    ],
)
def test_kubernetes_invalid(request_: Request, fragment: str) -> None:
    result = map_request(KUBE, request_)
    assert isinstance(result, Invalid), result
    assert fragment in result.reason


# --- profile: http --------------------------------------------------------------------------

SEND = "/v1/invoices/inv_7/send"

HTTP_MAPPED = [
    (req("POST", SEND), "billing.send_invoice", {"invoice_id": "inv_7"}),
    (
        req("POST", SEND, js({"channel": "email", "copies": 2, "to": ["a@b.c"]}), JSON),
        "billing.send_invoice",
        {"invoice_id": "inv_7", "channel": "email", "copies": 2, "to": ["a@b.c"]},
    ),
    (  # nested text may hold newlines: no effect template can reach it
        req("POST", SEND, js({"note": {"text": "Hi,\nthanks"}}), JSON),
        "billing.send_invoice",
        {"invoice_id": "inv_7", "note": {"text": "Hi,\nthanks"}},
    ),
    (
        req(
            "POST", SEND, js({"invoice_id": "inv_7"}), {"content-type": "application/vnd.api+json"}
        ),
        "billing.send_invoice",
        {"invoice_id": "inv_7"},
    ),
    (
        req("POST", SEND, "channel=sms&to=1&to=2", FORM),
        "billing.send_invoice",
        {"invoice_id": "inv_7", "channel": "sms", "to": ["1", "2"]},
    ),
    (
        req("PUT", "/v1/accounts/7/limits/daily", js({"account": 7, "limit": 100}), JSON),
        "billing.set_limit",
        {"account": "7", "kind": "daily", "limit": 100},
    ),
    (req("DELETE", "/v1/items/it%201"), "billing.delete_item", {"item": "it 1"}),
]


@pytest.mark.parametrize(("request_", "action", "arguments"), HTTP_MAPPED)
def test_http_mapped(request_: Request, action: str, arguments: dict[str, Any]) -> None:
    assert map_request(HTTP, request_) == Mapped(action, arguments)


@pytest.mark.parametrize(
    "request_",
    [
        req("POST", "/v1/invoices/inv_7"),
        req("PUT", SEND),
        req("POST", SEND + "/now"),
        req("POST", "/v1/x-y"),
        req("PATCH", "/v1/items/1"),
    ],
)
def test_http_unmapped(request_: Request) -> None:
    assert isinstance(map_request(HTTP, request_), Unmapped)


@pytest.mark.parametrize(
    ("request_", "fragment"),
    [
        (req("POST", SEND, b'{"copies": 1.5}', JSON), "non-integer"),
        (req("POST", SEND, b'{"a": {"b": [1, 2.0]}}', JSON), "non-integer"),
        (req("POST", SEND, b'{"copies": 1e3}', JSON), "non-integer"),
        (req("POST", SEND, b'{"copies": Infinity}', JSON), "Infinity"),
        (req("POST", SEND, b"[1, 2]", JSON), "object"),
        (req("POST", SEND, b"{", JSON), "not valid JSON"),
        (req("POST", SEND, b'{"a": 1, "a": 2}', JSON), "repeats"),
        (req("POST", SEND, b'{"to": "\xff"}', JSON), "UTF-8"),
        (req("POST", SEND, b'{"to": "\\ud800"}', JSON), "surrogate"),
        (req("POST", SEND, b'{"to": "a\\r\\nX-Evil: 1"}', JSON), "control character"),
        (req("POST", SEND, b'{"nested": {"k\\n": 1}}', JSON), "control character"),
        (req("POST", SEND, b'{"invoice_id": "inv_8"}', JSON), "path says"),
        (req("POST", SEND, b"to=%0D%0A", FORM), "control character"),
        (req("POST", SEND, b"to", FORM), "no '='"),
        (req("POST", SEND, b"hello", {"content-type": "text/plain"}), "cannot read"),
        (req("POST", SEND, b"hello"), "untyped"),
        (req("POST", SEND, HUGE, JSON), "at most"),
        (req("POST", SEND, b"[" * 100_000 + b"]" * 100_000, JSON), "not valid JSON"),
        (req("POST", SEND, b'{"n": 1' + b"0" * 5000 + b"}", JSON), "not valid JSON"),
    ],
)
def test_http_invalid(request_: Request, fragment: str) -> None:
    result = map_request(HTTP, request_)
    assert isinstance(result, Invalid), result
    assert fragment in result.reason


@pytest.mark.parametrize(
    ("upstream", "request_", "expected"),
    [
        (
            STRIPE,
            req(
                "POST",
                "/v1/refunds",
                gzip.compress(b"payment_intent=pi_1"),
                {**FORM, "content-encoding": "gzip"},
            ),
            Invalid,
        ),
        (
            STRIPE,
            req(
                "POST",
                "/v1/refunds",
                "payment_intent=pi_1",
                {**FORM, "content-encoding": "identity"},
            ),
            Mapped,
        ),
        (STRIPE, req("DELETE", "/v1/customers/cus_1", b"", {"content-encoding": "gzip"}), Mapped),
        (
            KUBE,
            req(
                "PATCH",
                SCALE,
                gzip.compress(js({"spec": {"replicas": 6}})),
                {**MERGE, "content-encoding": "gzip"},
            ),
            Invalid,
        ),
        (HTTP, req("POST", SEND, b"{}", {**JSON, "content-encoding": "br"}), Invalid),
        (HTTP, req("POST", "/v1/unrouted", b"\x00", {"content-encoding": "br"}), Unmapped),
    ],
)
def test_encoded_bodies_are_not_guessed_at(
    upstream: Upstream, request_: Request, expected: type
) -> None:
    assert isinstance(map_request(upstream, request_), expected)


@pytest.mark.parametrize("method", ["PROPFIND", "get", "Head", "TRACE"])
def test_unknown_method_is_unmapped_not_passed(method: str) -> None:
    # "get" is not GET to every server (the apiserver lower-cases a method to find its verb).
    assert isinstance(map_request(HTTP, req(method, SEND)), Unmapped)


# --- never raises ---------------------------------------------------------------------------

_PATHS = st.one_of(
    st.text(max_size=60),
    st.sampled_from(["/v1/refunds", SCALE, DEPLOY, NS, SEND, "/v1/customers/c"]).flatmap(
        lambda p: st.text(alphabet="%/.0123456789abcdefFX\r\n", max_size=8).map(lambda s: p + s)
    ),
)
_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_BODIES = st.one_of(
    st.binary(max_size=200),
    _JSONISH.map(lambda v: json.dumps(v).encode()),
    st.lists(st.tuples(st.text(max_size=10), st.text(max_size=10)), max_size=5).map(
        lambda pairs: "&".join(f"{k}={v}" for k, v in pairs).encode("utf-8", "surrogatepass")
    ),
)
_TYPES = st.sampled_from(
    [
        "",
        "application/json",
        "application/x-www-form-urlencoded",
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
        "application/json-patch+json",
        "application/apply-patch+yaml",
        "text/plain",
    ]
)


@settings(max_examples=400, deadline=None)
@given(
    upstream=st.sampled_from([STRIPE, KUBE, HTTP]),
    method=st.one_of(
        st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE"]), st.text(max_size=8)
    ),
    path=_PATHS,
    body=_BODIES,
    kind=_TYPES,
    query=st.dictionaries(
        st.text(max_size=8), st.lists(st.text(max_size=8), max_size=3), max_size=3
    ),
)
def test_map_request_never_raises(
    upstream: Upstream, method: str, path: str, body: bytes, kind: str, query: dict[str, list[str]]
) -> None:
    result = map_request(upstream, Request(method, path, query, {"content-type": kind}, body))
    assert isinstance(result, (PassThrough, Mapped, Unmapped, Invalid, KubeWrite))
    if isinstance(result, Mapped):
        # Arguments are plain JSON the kernel can hash: no floats, encodable text.
        json.dumps(result.arguments, ensure_ascii=False).encode("utf-8")
        assert not _has_float(result.arguments)


def _has_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_has_float(item) for item in value.values())
    if isinstance(value, list):
        return any(_has_float(item) for item in value)
    return False
