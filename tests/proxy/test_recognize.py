"""Recognition by address: every spelling of a host, resolution cached, the in-cluster names;
and the gate over it (mismatched names, egress, observe mode) on a real SQLite ledger."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from ctrlrun.action import Principal
from ctrlrun.control import Control
from ctrlrun.errors import PolicyError
from ctrlrun.proxy.config import Upstream
from ctrlrun.proxy.config_parse import policy_from_yaml, proxy_config
from ctrlrun.proxy.egress import Egress
from ctrlrun.proxy.gate import Asked, Gate
from ctrlrun.proxy.hosts import LOOPBACK, literal, normalize
from ctrlrun.proxy.principal import Principals
from ctrlrun.proxy.recognize import Recognizer, cluster_aliases
from ctrlrun.receipts import load_receipts
from ctrlrun.store import SQLiteStateStore

STRIPE = Upstream("stripe", "stripe", "https://api.stripe.com", "https", "api.stripe.com", 443)
KUBE = Upstream(
    "prod", "kubernetes", "https://kubernetes.default.svc", "https", "kubernetes.default.svc", 443
)
DNS = {
    "api.stripe.com": ("54.187.1.1", "2600:1f14::1"),
    "alias.example": ("54.187.1.1",),
    "mapped.example": ("::ffff:54.187.1.1",),
    "other.example": ("93.184.215.14",),
}


class Resolver:
    """A resolver from a table, counting its lookups."""

    def __init__(self, table: dict[str, tuple[str, ...]]) -> None:
        self.table, self.lookups = dict(table), 0

    async def __call__(self, name: str) -> tuple[str, ...]:
        self.lookups += 1
        await asyncio.sleep(0)
        if name not in self.table:
            raise OSError(f"{name}: no such host")
        return self.table[name]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", LOOPBACK),
        ("127.1", LOOPBACK),
        ("2130706433", LOOPBACK),
        ("0x7f000001", LOOPBACK),
        ("0x7f.0.0.1", LOOPBACK),
        ("0177.0.0.1", LOOPBACK),
        ("127.0.0.2", LOOPBACK),
        ("0.0.0.0", LOOPBACK),
        ("[::1]", LOOPBACK),
        ("::", LOOPBACK),
        ("[::ffff:127.0.0.1]", LOOPBACK),
        ("::ffff:10.0.0.1", "10.0.0.1"),
        ("10.1", "10.0.0.1"),
        ("167772161", "10.0.0.1"),
        ("8.8.8.8", "8.8.8.8"),
        ("[2600:1F14::1]", "2600:1f14::1"),
        ("example.com", None),
        ("localhost", None),  # a name: the resolver says where it goes
        ("1.2.3.4.5", None),
    ],
)
def test_every_literal_form_is_read_as_connect_reads_it(host: str, expected: str | None) -> None:
    assert literal(host) == expected


@pytest.mark.parametrize(
    ("host", "expected"),
    [("API.Stripe.COM.", "api.stripe.com"), ("[::1]", "::1"), (" Example.com ", "example.com")],
)
def test_names_are_normalised(host: str, expected: str) -> None:
    assert normalize(host) == expected


def recognizer(**kw: object) -> tuple[Recognizer, Resolver, Clock]:
    resolver, clock = Resolver(DNS), Clock()
    return Recognizer([STRIPE], resolve=resolver, clock=clock, environ={}, **kw), resolver, clock  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("host", "port", "guarded"),
    [
        ("API.STRIPE.COM.", 443, True),
        ("54.187.1.1", 443, True),
        ("alias.example", 443, True),
        ("mapped.example", 443, True),
        ("[::ffff:54.187.1.1]", 443, True),
        ("[2600:1f14::1]", 443, True),
        ("54.187.1.1", 80, False),  # another port is another server
        ("other.example", 443, False),
    ],
)
def test_a_destination_is_its_upstream_whatever_its_name(
    host: str, port: int, guarded: bool
) -> None:
    rec, _, _ = recognizer()
    got = asyncio.run(rec.destination(host, port))
    assert (got.upstream is STRIPE) is guarded and got.refused is None


def test_a_pass_through_is_pinned_to_the_address_that_was_checked() -> None:
    rec, _, _ = recognizer()
    got = asyncio.run(rec.destination("other.example", 443))
    assert got.upstream is None and got.dial == "93.184.215.14"


def test_a_name_that_resolves_nowhere_is_refused() -> None:
    rec, _, _ = recognizer()
    got = asyncio.run(rec.destination("nowhere.example", 443))
    assert got.refused is not None and "nowhere.example" in got.refused


def test_resolution_is_cached_for_its_ttl_and_shared_by_concurrent_askers() -> None:
    rec, resolver, clock = recognizer(ttl=30.0)

    async def many() -> None:
        await asyncio.gather(*(rec.destination("alias.example", 443) for _ in range(20)))

    asyncio.run(many())
    assert resolver.lookups == 2  # the upstream's own name and the alias, once each
    asyncio.run(many())
    assert resolver.lookups == 2
    clock.now += 31
    asyncio.run(many())
    assert resolver.lookups == 4


def test_an_address_the_upstream_had_still_reaches_it_after_the_dns_moves() -> None:
    rec, resolver, clock = recognizer(ttl=30.0)
    asyncio.run(rec.refresh())  # as the proxy does at start
    resolver.table["api.stripe.com"] = ("54.187.9.9",)
    clock.now += 31
    assert asyncio.run(rec.destination("54.187.1.1", 443)).upstream is STRIPE
    assert asyncio.run(rec.destination("54.187.9.9", 443)).upstream is STRIPE
    assert rec.known("54.187.1.1", 443) is STRIPE  # the tunnel rule, never waiting


def test_two_upstreams_on_one_address_refuse_rather_than_guess() -> None:
    twin = Upstream("twin", "http", "https://alias.example", "https", "alias.example", 443)
    rec = Recognizer([STRIPE, twin], resolve=Resolver(DNS), environ={})
    got = asyncio.run(rec.destination("54.187.1.1", 443))
    assert got.upstream is None and got.refused is not None and "twin" in got.refused


@pytest.mark.parametrize(
    ("host", "env", "aliases"),
    [
        ("kubernetes.default.svc", {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, ("10.96.0.1",)),
        ("kubernetes.default", {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, ("10.96.0.1",)),
        (
            "kubernetes.default.svc.cluster.local",
            {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
            ("10.96.0.1",),
        ),
        ("10.96.0.1", {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, ("10.96.0.1",)),
        ("kubernetes.default.svc", {}, ()),
        (
            "kubernetes.default.svc",
            {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "6443"},
            (),
        ),
        ("api.example.com", {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, ()),
    ],
)
def test_in_cluster_the_service_name_and_its_address_are_one_upstream(
    host: str, env: dict[str, str], aliases: tuple[str, ...]
) -> None:
    up = Upstream("prod", "kubernetes", f"https://{host}", "https", host, 443)
    assert cluster_aliases(up, env) == aliases


def test_the_in_cluster_address_reaches_the_upstream_named_by_the_service() -> None:
    rec = Recognizer([KUBE], resolve=Resolver({}), environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1"})
    assert asyncio.run(rec.destination("10.96.0.1", 443)).upstream is KUBE
    assert asyncio.run(rec.destination("kubernetes.default.svc.", 443)).upstream is KUBE


# -- the gate --------------------------------------------------------------------------------


@pytest.fixture
def control(tmp_path: Path) -> Iterator[Control]:
    policy = policy_from_yaml("schema: ctrlrun.policy/v2\nactions: {}\n")
    ctl = Control(policy, SQLiteStateStore(tmp_path / "state.db"))
    yield ctl
    ctl.store.close()


def gate(control: Control, egress: Egress) -> Gate:
    return Gate(
        Recognizer([STRIPE], resolve=Resolver(DNS), environ={}), lambda: control, lambda: egress
    )


def results(control: Control) -> list[tuple[str, str, str]]:
    with control.store.reading() as conn:
        return [(r.action, r.result, r.decision_reason) for r in load_receipts(conn)]


BOT = Principal("bot")


@pytest.mark.parametrize(
    ("asked", "reason"),
    [
        # Another server's address, with the upstream's name in the SNI or Host: fronting.
        (Asked("CONNECT", "93.184.215.14", 443, names=("api.stripe.com",)), "destination_mismatch"),
        (Asked("GET", "other.example", 443, "/", ("API.STRIPE.COM.",)), "destination_mismatch"),
        # The upstream's address, with another server's name.
        (
            Asked("POST", "54.187.1.1", 443, "/v1/refunds", ("other.example",)),
            "destination_mismatch",
        ),
        (
            Asked("POST", "alias.example", 443, "/v1/refunds", ("nowhere.example",)),
            "destination_mismatch",
        ),
        (Asked("CONNECT", "nowhere.example", 443), "unresolvable"),
    ],
)
def test_names_that_disagree_about_an_upstream_are_refused_with_a_receipt(
    control: Control, asked: Asked, reason: str
) -> None:
    got = asyncio.run(gate(control, Egress()).passage(asked))
    assert got.refusal is not None and got.refusal.reason == reason
    assert got.refusal.receipt_id is not None
    assert results(control) == [(f"proxy.{reason}", "denied", reason)]


def test_names_that_agree_pass() -> None:
    g = Gate(
        Recognizer([STRIPE], resolve=Resolver(DNS), environ={}), lambda: _never(), lambda: Egress()
    )
    got = asyncio.run(g.passage(Asked("POST", "54.187.1.1", 443, "/", ("alias.example",))))
    assert got.upstream is STRIPE and got.refusal is None


def _never() -> Control:
    raise AssertionError("no refusal, no receipt")


def test_egress_deny_refuses_unlisted_hosts_and_passes_listed_ones(control: Control) -> None:
    egress = Egress("deny", ("*.example",))
    g = gate(control, egress)
    assert asyncio.run(g.passage(Asked("CONNECT", "other.example", 443))).refusal is None
    assert asyncio.run(g.passage(Asked("CONNECT", "api.stripe.com", 443))).upstream is STRIPE
    egress_only = gate(control, Egress("deny", ("api.openai.com",)))
    got = asyncio.run(egress_only.passage(Asked("CONNECT", "other.example", 443, principal=BOT)))
    assert got.refusal is not None and "other.example:443" in got.refusal.message
    assert results(control) == [("proxy.egress_denied", "denied", "egress_denied")]


def test_observe_mode_records_what_egress_would_refuse_and_lets_it_go(tmp_path: Path) -> None:
    policy = policy_from_yaml("schema: ctrlrun.policy/v2\nmode: observe\nactions: {}\n")
    ctl = Control(policy, SQLiteStateStore(tmp_path / "state.db"))
    try:
        got = asyncio.run(gate(ctl, Egress("deny")).passage(Asked("CONNECT", "other.example", 443)))
        assert got.refusal is None and got.dial == "93.184.215.14"
        assert results(ctl) == [("proxy.egress_denied", "observed", "egress_denied")]
    finally:
        ctl.store.close()


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("api.openai.com", True),
        ("API.OPENAI.COM.", True),
        ("eu.api.anthropic.com", True),
        ("anthropic.com", False),  # "*.x" is what is under x, not x
        ("evil-anthropic.com", False),
        ("api.openai.com.evil.net", False),
        ("10.0.0.7", True),
        ("167772167", True),  # 10.0.0.7 as an integer
        ("10.0.0.8", False),
    ],
)
def test_egress_entries_match_as_the_resolver_reads_hosts(host: str, allowed: bool) -> None:
    egress = Egress("deny", ("api.openai.com", "*.anthropic.com", "10.0.0.7"))
    assert egress.allows(host) is allowed


def test_the_egress_section_is_parsed_with_the_policy() -> None:
    text = (
        "schema: ctrlrun.policy/v2\nactions: {}\n"
        "egress:\n  default: deny\n  allow: [API.OpenAI.com, '*.anthropic.com']\n"
    )
    assert proxy_config(policy_from_yaml(text)).egress == Egress(
        "deny", ("api.openai.com", "*.anthropic.com")
    )
    bare = proxy_config(policy_from_yaml("schema: ctrlrun.policy/v2\nactions: {}\n"))
    assert bare.egress == Egress("allow", ())


@pytest.mark.parametrize(
    ("section", "words"),
    [
        ("egress: {default: maybe}", "default"),
        ("egress: {allow: api.openai.com}", "list of hosts"),
        ("egress: {allow: ['*']}", "host name"),
        ("egress: {allow: ['http://x.com/']}", "host name"),
        ("egress: {deny: [x.com]}", "deny"),
    ],
)
def test_a_bad_egress_section_is_one_line_naming_the_key(section: str, words: str) -> None:
    with pytest.raises(PolicyError) as info:
        policy_from_yaml(f"schema: ctrlrun.policy/v2\nactions: {{}}\n{section}\n")
    assert words in str(info.value) and "\n" not in str(info.value)


def test_listed_tokens_are_the_only_way_in_even_beside_a_fixed_principal() -> None:
    from ctrlrun.proxy.config import AgentCredential

    principals = Principals("fixed", (AgentCredential("bot", "T"),), {"T": "s3cret"})
    assert principals.resolve(None) is None
    assert principals.resolve("Basic Ym90Ondyb25n") is None  # bot:wrong
    assert principals.resolve("Basic Ym90OnMzY3JldA==") == Principal("bot")  # bot:s3cret
    assert Principals("fixed", ()).resolve(None) == Principal("fixed")
