"""Malformed proxy sections (``upstreams:``, ``agents:``): one line naming file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrlrun.errors import PolicyError
from ctrlrun.proxy.config_parse import load_policy, policy_from_yaml

V1 = "schema: ctrlrun.policy/v1\n"
V2 = "schema: ctrlrun.policy/v2\n"
ALLOW = "actions:\n  a: {decision: allow}\n"

# (id, document, line of the error, fragments the message must contain)
CASES: list[tuple[str, str, int, tuple[str, ...]]] = [
    ("v2_key_under_v1_upstreams", V1 + ALLOW + "upstreams: {}\n", 4, ("upstreams:", "v2")),
    ("v2_key_under_v1_agents", V1 + ALLOW + "agents: {}\n", 4, ("agents:", "v2")),
    ("upstreams_list", V2 + ALLOW + "upstreams: [a]\n", 4, ("upstreams:", "must be a mapping")),
    ("agents_null", V2 + ALLOW + "agents:\n", 4, ("agents:", "None")),
    (
        "float_in_upstream",
        V2
        + ALLOW
        + "upstreams:\n  s:\n    profile: stripe\n    url: https://x.test\n"
        + "    timeout: 1.5\n",
        8,
        ("upstreams.s.timeout:", "1.5"),
    ),
    (
        "bad_upstream_url_path",
        V2 + ALLOW + "upstreams:\n  s:\n    profile: stripe\n    url: https://api.stripe.com/v1\n",
        7,
        ("upstreams.s.url:", "no path"),
    ),
    (
        "bad_upstream_url_scheme",
        V2 + ALLOW + "upstreams:\n  s:\n    profile: stripe\n    url: ftp://api.stripe.com\n",
        7,
        ("upstreams.s.url:", "'ftp'"),
    ),
    (
        "unknown_profile",
        V2 + ALLOW + "upstreams:\n  s:\n    profile: grpc\n    url: https://x.test\n",
        6,
        ("upstreams.s.profile:", "'grpc'", "stripe, kubernetes, http"),
    ),
    (
        "unknown_upstream_key",
        V2
        + ALLOW
        + "upstreams:\n  s:\n    profile: stripe\n    url: https://x.test\n    host: x\n",
        8,
        ("upstreams.s.host:", "unknown key"),
    ),
    (
        "routes_on_stripe",
        V2
        + ALLOW
        + "upstreams:\n  s:\n    profile: stripe\n    url: https://x.test\n"
        + "    routes: [{method: POST, path: /x, action: a}]\n",
        8,
        ("upstreams.s.routes:", "profile: http"),
    ),
    (
        "duplicate_listen",
        V2
        + ALLOW
        + "upstreams:\n  s:\n    profile: stripe\n    url: https://x.test\n"
        + "    listen: 127.0.0.1:8101\n"
        + "  k:\n    profile: kubernetes\n    url: https://k.test\n    listen: 127.0.0.1:8101\n",
        12,
        ("upstreams.k.listen:", "port 8101", "'s'"),
    ),
    (
        "route_unknown_action",
        V2
        + ALLOW
        + "upstreams:\n  b:\n    profile: http\n    url: http://b.test\n    routes:\n"
        + "      - method: POST\n        path: /v1/x/{id}\n        action: billing.send\n",
        11,
        ("upstreams.b.routes[0].action:", "'billing.send' is not declared"),
    ),
    (
        "unknown_route_key",
        V2
        + ALLOW
        + "upstreams:\n  b:\n    profile: http\n    url: http://b.test\n    routes:\n"
        + "      - {method: POST, path: /x, action: a}\n      - method: PUT\n        verb: x\n",
        11,
        ("upstreams.b.routes[1].verb:", "unknown key"),
    ),
    (
        "unknown_route_reconcile_key",
        V2
        + ALLOW
        + "upstreams:\n  b:\n    profile: http\n    url: http://b.test\n    routes:\n"
        + "      - method: POST\n        path: /x\n        action: a\n        reconcile:\n"
        + "          get: /x\n          committed: {status: sent}\n"
        + "          not_executed: {status: draft}\n          delete: /x\n",
        16,
        ("upstreams.b.routes[0].reconcile.delete:", "unknown key"),
    ),
    (
        "unknown_agent_key",
        V2 + ALLOW + "agents:\n  bot:\n    token: s3cret\n",
        6,
        ("agents.bot.token:", "unknown key", "token_env"),
    ),
]


def _ids() -> list[str]:
    return [case[0] for case in CASES]


def test_the_table_has_distinct_documents() -> None:
    assert len({case[1] for case in CASES}) == len(CASES) >= 15
    assert len(set(_ids())) == len(CASES)


@pytest.mark.parametrize(("doc", "line", "fragments"), [c[1:] for c in CASES], ids=_ids())
def test_load_policy_names_file_line_and_key(
    tmp_path: Path, doc: str, line: int, fragments: tuple[str, ...]
) -> None:
    path = tmp_path / "ctrlrun.yaml"
    path.write_text(doc)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    message = str(info.value)
    assert "\n" not in message
    assert "Traceback" not in message
    assert message.startswith(f"{path}:{line}: "), message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize(("doc", "line", "fragments"), [c[1:] for c in CASES], ids=_ids())
def test_policy_from_yaml_names_its_source(doc: str, line: int, fragments: tuple[str, ...]) -> None:
    with pytest.raises(PolicyError) as info:
        policy_from_yaml(doc, source="inline.yaml")
    assert str(info.value).startswith(f"inline.yaml:{line}: ")
    assert info.value.__cause__ is None  # one line, no chained traceback for expected errors
