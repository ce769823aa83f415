"""The ``upstreams:`` and ``agents:`` sections: parsed values, defaults and errors."""

from __future__ import annotations

import pytest

from ctrlrun.errors import PolicyError
from ctrlrun.policy import Policy
from ctrlrun.proxy.config import AgentCredential, ProxyConfig, Route, RouteReconcile, Upstream
from ctrlrun.proxy.config_parse import (
    AGENTS,
    SECTIONS,
    UPSTREAMS,
    parse_listen,
    parse_url,
    policy_from_yaml,
    proxy_config,
)
from ctrlrun.yamlstrict import Where

HEAD = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund: {decision: allow}
  billing.send_invoice: {decision: allow}
  billing.void: {decision: approve}
"""

FULL = (
    HEAD
    + """\
upstreams:
  stripe:
    profile: stripe
    url: https://api.stripe.com
    listen: 127.0.0.1:8101
    api_key_env: STRIPE_API_KEY
  prod-eu:
    profile: kubernetes
    url: https://10.0.0.1:6443
    cluster: eu-1
    ca_file: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
    token_file: /var/run/secrets/kubernetes.io/serviceaccount/token
    timeout: 45
    reconcile: off
  staging:
    profile: kubernetes
    url: https://[fd00::1]:6443/
  billing:
    profile: http
    url: http://billing.internal:8000
    unmapped_writes: allow
    routes:
      - method: POST
        path: /v1/invoices/{invoice_id}/send
        action: billing.send_invoice
        reconcile:
          get: /v1/invoices/{invoice_id}
          committed: {status: sent, meta.sent_by: "{agent_name}"}
          not_executed: {status: draft}
      - method: delete
        path: /v1/invoices/{invoice_id}
        action: billing.void
agents:
  refund-agent: {token_env: REFUND_AGENT_PROXY_TOKEN}
  ops-agent:
    token_env: OPS_AGENT_PROXY_TOKEN
"""
)


def test_full_example_parses_into_values() -> None:
    proxy = proxy_config(policy_from_yaml(FULL))
    assert proxy == ProxyConfig(
        upstreams=(
            Upstream(
                name="stripe",
                profile="stripe",
                url="https://api.stripe.com",
                scheme="https",
                host="api.stripe.com",
                port=443,
                listen=("127.0.0.1", 8101),
                api_key_env="STRIPE_API_KEY",
            ),
            Upstream(
                name="prod-eu",
                profile="kubernetes",
                url="https://10.0.0.1:6443",
                scheme="https",
                host="10.0.0.1",
                port=6443,
                cluster="eu-1",
                ca_file="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
                token_file="/var/run/secrets/kubernetes.io/serviceaccount/token",
                timeout=45.0,
                reconcile="off",
            ),
            Upstream(
                name="staging",
                profile="kubernetes",
                url="https://[fd00::1]:6443",
                scheme="https",
                host="fd00::1",
                port=6443,
                cluster="staging",  # defaults to the upstream's name
            ),
            Upstream(
                name="billing",
                profile="http",
                url="http://billing.internal:8000",
                scheme="http",
                host="billing.internal",
                port=8000,
                unmapped_writes="allow",
                routes=(
                    Route(
                        method="POST",
                        path="/v1/invoices/{invoice_id}/send",
                        action="billing.send_invoice",
                        reconcile=RouteReconcile(
                            get="/v1/invoices/{invoice_id}",
                            committed={"status": "sent", "meta.sent_by": "{agent_name}"},
                            not_executed={"status": "draft"},
                        ),
                    ),
                    Route(method="DELETE", path="/v1/invoices/{invoice_id}", action="billing.void"),
                ),
            ),
        ),
        agents=(
            AgentCredential("refund-agent", "REFUND_AGENT_PROXY_TOKEN"),
            AgentCredential("ops-agent", "OPS_AGENT_PROXY_TOKEN"),
        ),
    )
    committed = proxy.upstreams[3].routes[0].reconcile
    assert committed is not None and type(committed.committed) is dict


def test_defaults() -> None:
    policy = policy_from_yaml(HEAD + "upstreams:\n  s: {profile: stripe, url: 'https://s.test'}\n")
    (upstream,) = policy.section(UPSTREAMS)
    assert upstream.timeout == 30.0
    assert upstream.reconcile == "eager"
    assert upstream.unmapped_writes == "deny"
    assert upstream.listen is None and upstream.cluster is None and upstream.routes == ()
    assert policy.section(AGENTS) == ()


def test_no_sections_means_an_empty_proxy_config() -> None:
    assert proxy_config(policy_from_yaml(HEAD)) == ProxyConfig()
    assert proxy_config(policy_from_yaml(HEAD + "upstreams: {}\nagents: {}\n")) == ProxyConfig()


def test_the_sdk_loads_the_same_file_without_reading_the_proxy_sections() -> None:
    sdk = Policy.from_yaml(FULL)
    proxy = policy_from_yaml(FULL)
    assert sdk.actions.keys() == proxy.actions.keys()
    assert sdk.policy_hash == proxy.policy_hash  # one file, one hash, whoever reads it
    with pytest.raises(LookupError, match="without section 'upstreams'"):
        proxy_config(sdk)
    assert Policy.from_yaml(FULL, sections=SECTIONS).sections == proxy.sections


def test_a_room_parses_only_top_level_keys_of_the_file_format() -> None:
    from ctrlrun.policy_sections import Section

    for name in ("actions", "mode", "egress-typo"):
        with pytest.raises(ValueError, match="not a top-level key"):
            Policy.from_yaml(HEAD, sections=(Section(name, lambda v, w, c: v, None),))


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://api.stripe.com", ("https", "api.stripe.com", 443, "https://api.stripe.com")),
        ("https://API.Stripe.com/", ("https", "api.stripe.com", 443, "https://api.stripe.com")),
        ("https://api.stripe.com:443", ("https", "api.stripe.com", 443, "https://api.stripe.com")),
        ("http://billing:80", ("http", "billing", 80, "http://billing")),
        ("http://billing", ("http", "billing", 80, "http://billing")),
        ("http://127.0.0.1:8000", ("http", "127.0.0.1", 8000, "http://127.0.0.1:8000")),
        ("https://10.0.0.1:6443/", ("https", "10.0.0.1", 6443, "https://10.0.0.1:6443")),
        ("https://[::1]:6443", ("https", "::1", 6443, "https://[::1]:6443")),
        ("https://[FD00::1]", ("https", "fd00::1", 443, "https://[fd00::1]")),
        ("https://k8s.local.:443", ("https", "k8s.local.", 443, "https://k8s.local.")),
    ],
)
def test_parse_url(url: str, expected: tuple[str, str, int, str]) -> None:
    assert parse_url(url, Where("p", "u", 1)) == expected


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("ftp://x.test", "'ftp'"),
        ("api.stripe.com", "scheme"),
        ("https://x.test/v1", "no path"),
        ("https://x.test?a=1", "no path, query"),
        ("https://x.test#top", "fragment"),
        ("https://x.test:0", "1..65535"),
        ("https://x.test:70000", "out of range"),
        ("https://x.test:abc", "must be scheme://host"),
        ("https://", "has no host"),
        ("https://:443", "has no host"),
        ("https://[::1", "must be scheme://host"),
        ("https://bad host", "not a host name"),
        ("https://user:pw@x.test", "must not carry a user or password"),
        (8080, "non-empty string"),
        ("", "non-empty string"),
    ],
)
def test_parse_url_errors(url: object, fragment: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_url(url, Where("p.yaml", "upstreams.s.url", 9))
    message = str(info.value)
    assert message.startswith("p.yaml:9: upstreams.s.url: ")
    assert fragment in message
    assert "pw" not in message  # a credential in a URL is never echoed


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        ("127.0.0.1:8101", ("127.0.0.1", 8101)),
        ("localhost:1", ("localhost", 1)),
        ("0.0.0.0:65535", ("0.0.0.0", 65535)),
        ("[::1]:8101", ("::1", 8101)),
        ("[::]:8101", ("::", 8101)),
    ],
)
def test_parse_listen(listen: str, expected: tuple[str, int]) -> None:
    assert parse_listen(listen, Where("p", "l", 1)) == expected


@pytest.mark.parametrize(
    ("listen", "fragment"),
    [
        (8101, "'host:port'"),
        ("8101", "'host:port'"),
        (":8101", "'host:port'"),
        ("127.0.0.1:", "'host:port'"),
        ("127.0.0.1:0", "1..65535"),
        ("127.0.0.1:65536", "1..65535"),
        ("127.0.0.1:80a", "'host:port'"),
        ("::1:8101", "brackets"),
        ("[nothost]:8101", "not an IPv6 address"),
        ("bad host:8101", "not a host name"),
    ],
)
def test_parse_listen_errors(listen: object, fragment: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_listen(listen, Where("p.yaml", "upstreams.s.listen", 4))
    assert str(info.value).startswith("p.yaml:4: upstreams.s.listen: ")
    assert fragment in str(info.value)


# (id, upstreams/agents YAML after HEAD, line, fragments); HEAD is 5 lines long
ERRORS: list[tuple[str, str, int, tuple[str, ...]]] = [
    ("upstreams_list", "upstreams: [a]\n", 6, ("upstreams:", "must be a mapping")),
    ("upstreams_null", "upstreams:\n", 6, ("upstreams:", "None")),
    ("entry_not_mapping", "upstreams:\n  s: stripe\n", 7, ("upstreams.s:", "mapping")),
    ("missing_profile", "upstreams:\n  s: {url: 'https://x'}\n", 7, ("upstreams.s:", "'profile'")),
    ("missing_url", "upstreams:\n  s:\n    profile: http\n", 7, ("upstreams.s:", "'url'")),
    ("url_with_path", "upstreams:\n  s: {profile: http, url: 'http://x/a'}\n", 7, ("s.url:",)),
    (
        "cluster_on_http",
        "upstreams:\n  s:\n    profile: http\n    url: http://x\n    cluster: c\n",
        10,
        ("upstreams.s.cluster:", "kubernetes"),
    ),
    (
        "api_key_env_on_kubernetes",
        "upstreams:\n  k:\n    profile: kubernetes\n    url: https://k\n    api_key_env: K\n",
        10,
        ("upstreams.k.api_key_env:", "stripe"),
    ),
    (
        "token_file_on_stripe",
        "upstreams:\n  s:\n    profile: stripe\n    url: https://s\n    token_file: /t\n",
        10,
        ("upstreams.s.token_file:", "kubernetes"),
    ),
    (
        "bad_env_name",
        "upstreams:\n  s:\n    profile: stripe\n    url: https://s\n    api_key_env: a b\n",
        10,
        ("upstreams.s.api_key_env:", "environment variable"),
    ),
    (
        "timeout_zero",
        "upstreams:\n  s: {profile: http, url: 'http://x', timeout: 0}\n",
        7,
        ("s.timeout:", "positive integer"),
    ),
    (
        "timeout_float",
        "upstreams:\n  s: {profile: http, url: 'http://x', timeout: 2.5}\n",
        7,
        ("s.timeout:", "2.5"),
    ),
    (
        "timeout_bool",
        "upstreams:\n  s: {profile: http, url: 'http://x', timeout: true}\n",
        7,
        ("s.timeout:", "True"),
    ),
    (
        "bad_reconcile",
        "upstreams:\n  s: {profile: http, url: 'http://x', reconcile: never}\n",
        7,
        ("s.reconcile:", "eager, lazy, off"),
    ),
    (
        "bad_unmapped",
        "upstreams:\n  s: {profile: http, url: 'http://x', unmapped_writes: ok}\n",
        7,
        ("s.unmapped_writes:", "deny, allow"),
    ),
    (
        "empty_ca_file",
        "upstreams:\n  s: {profile: http, url: 'http://x', ca_file: ''}\n",
        7,
        ("s.ca_file:", "non-empty"),
    ),
    (
        "same_origin",
        "upstreams:\n  a: {profile: stripe, url: 'https://api.stripe.com'}\n"
        "  b:\n    profile: http\n    url: https://API.stripe.com:443/\n",
        10,
        ("upstreams.b.url:", "https://api.stripe.com", "'a'"),
    ),
    (
        "listen_wildcard_conflict",
        "upstreams:\n  a: {profile: http, url: 'http://a', listen: '0.0.0.0:9000'}\n"
        "  b: {profile: http, url: 'http://b', listen: '127.0.0.1:9000'}\n",
        8,
        ("upstreams.b.listen:", "9000"),
    ),
    (
        "routes_not_list",
        "upstreams:\n  b: {profile: http, url: 'http://b', routes: {a: b}}\n",
        7,
        ("b.routes:", "list"),
    ),
    (
        "route_get_method",
        "upstreams:\n  b:\n    profile: http\n    url: http://b\n    routes:\n"
        "      - {method: GET, path: /x, action: billing.void}\n",
        11,
        ("upstreams.b.routes[0].method:", "POST, PUT, PATCH, DELETE"),
    ),
    (
        "route_missing_path",
        "upstreams:\n  b:\n    profile: http\n    url: http://b\n    routes:\n"
        "      - {method: POST, action: billing.void}\n",
        11,
        ("upstreams.b.routes[0]:", "'path'"),
    ),
    (
        "route_relative_path",
        "upstreams:\n  b:\n    profile: http\n    url: http://b\n    routes:\n"
        "      - method: POST\n        path: v1/x\n        action: billing.void\n",
        12,
        ("upstreams.b.routes[0].path:", "starting with '/'"),
    ),
    (
        "route_bad_placeholder",
        "upstreams:\n  b:\n    profile: http\n    url: http://b\n    routes:\n"
        "      - method: POST\n        path: /v1/{id.x}\n        action: billing.void\n",
        12,
        ("upstreams.b.routes[0].path:", "plain identifier"),
    ),
    (
        "duplicate_route",
        "upstreams:\n  b:\n    profile: http\n    url: http://b\n    routes:\n"
        "      - {method: POST, path: '/v1/{a}', action: billing.void}\n"
        "      - {method: post, path: '/v1/{b}', action: billing.send_invoice}\n",
        12,
        ("upstreams.b.routes[1]:", "route [0]"),
    ),
    (
        "reconcile_missing_get",
        "upstreams:\n  b:\n    profile: http\n    url: http://b\n    routes:\n"
        "      - method: POST\n        path: /x\n        action: billing.void\n"
        "        reconcile: {committed: {a: 1}, not_executed: {a: 2}}\n",
        14,
        ("upstreams.b.routes[0].reconcile:", "'get'"),
    ),
    (
        "reconcile_empty_committed",
        "upstreams:\n  b:\n    profile: http\n    url: http://b\n    routes:\n"
        "      - method: POST\n        path: /x\n        action: billing.void\n"
        "        reconcile:\n          get: /x\n          committed: {}\n"
        "          not_executed: {a: 2}\n",
        16,
        ("upstreams.b.routes[0].reconcile.committed:", "at least one"),
    ),
    (
        "reconcile_float",
        "upstreams:\n  b:\n    profile: http\n    url: http://b\n    routes:\n"
        "      - method: POST\n        path: /x\n        action: billing.void\n"
        "        reconcile:\n          get: /x\n          committed: {a: 1}\n"
        "          not_executed:\n            amount: 0.5\n",
        18,
        ("upstreams.b.routes[0].reconcile.not_executed.amount:", "floats"),
    ),
    (
        "reconcile_bad_value_template",
        "upstreams:\n  b:\n    profile: http\n    url: http://b\n    routes:\n"
        "      - method: POST\n        path: /x\n        action: billing.void\n"
        "        reconcile:\n          get: /x\n          committed: {a: '{oops'}\n"
        "          not_executed: {a: 2}\n",
        16,
        ("upstreams.b.routes[0].reconcile.committed.a:", "stray brace"),
    ),
    ("agents_list", "agents: [a]\n", 6, ("agents:", "mapping")),
    ("agent_not_mapping", "agents:\n  bot: TOKEN\n", 7, ("agents.bot:", "mapping")),
    ("agent_missing_env", "agents:\n  bot: {}\n", 7, ("agents.bot:", "'token_env'")),
    (
        "agent_bad_env",
        "agents:\n  bot: {token_env: 'my token'}\n",
        7,
        ("agents.bot.token_env:", "environment variable"),
    ),
    (
        "agents_share_env",
        "agents:\n  a: {token_env: T}\n  b:\n    token_env: T\n",
        9,
        ("agents.b.token_env:", "agent 'a'"),
    ),
]


@pytest.mark.parametrize(
    ("tail", "line", "fragments"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_errors(tail: str, line: int, fragments: tuple[str, ...]) -> None:
    with pytest.raises(PolicyError) as info:
        policy_from_yaml(HEAD + tail, source="/etc/ctrlrun.yaml")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"/etc/ctrlrun.yaml:{line}: "), message
    for fragment in fragments:
        assert fragment in message, message
