"""Policy loading, evaluation and accessors."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctrlrun.action import canonical_bytes, sha256
from ctrlrun.errors import PolicyError
from ctrlrun.policy import Decision, Evaluation, Policy

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    resource: "payment:{payment_id}"
    window: 10m
    rules:
      - when: {amount_gte: 0, amount_lte: 5000, currency_in: [usd, eur]}
        decision: allow
      - when: {amount_gt: 5000, amount_lt: 100000}
        decision: approve
      - when: {reason_eq: fraud}
        decision: approve
  k8s.scale:
    effect: "scale:{cluster}:{deployment}:{replicas}"
    rules:
      - when: {namespace_neq: kube-system, replicas_lte: 20}
        decision: allow
      - decision: deny
  flags.set:
    rules:
      - when: {enabled_eq: true}
        decision: approve
      - when: {enabled_eq: false}
        decision: allow
  meta.tag:
    rules:
      - when: {labels_eq: {team: pay, tiers: [1, 2]}}
        decision: allow
      - when: {owner_eq: null}
        decision: deny
      - when: {level_in: [1, "2", true]}
        decision: approve
  ops.reboot: {decision: approve}
  ops.delete: {decision: deny}
  ops.ping: {decision: allow}
"""

ALLOW, APPROVE, DENY = Decision.ALLOW, Decision.APPROVE, Decision.DENY


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy.from_yaml(POLICY)


@pytest.mark.parametrize(
    ("name", "arguments", "decision", "reason"),
    [
        ("stripe.refund", {"amount": 0, "currency": "usd"}, ALLOW, "rule[0]"),
        ("stripe.refund", {"amount": 5000, "currency": "eur"}, ALLOW, "rule[0]"),
        ("stripe.refund", {"amount": 5000, "currency": "gbp"}, DENY, "no_matching_rule"),
        ("stripe.refund", {"amount": -1, "currency": "usd"}, DENY, "no_matching_rule"),
        ("stripe.refund", {"amount": 5001, "currency": "usd"}, APPROVE, "rule[1]"),
        ("stripe.refund", {"amount": 99999}, APPROVE, "rule[1]"),
        ("stripe.refund", {"amount": 100000}, DENY, "no_matching_rule"),
        ("stripe.refund", {"amount": 100000, "reason": "fraud"}, APPROVE, "rule[2]"),
        # a missing argument makes a condition false, never an error
        ("stripe.refund", {"currency": "usd"}, DENY, "no_matching_rule"),
        ("stripe.refund", {}, DENY, "no_matching_rule"),
        # numeric operators on a non-integer argument are false
        ("stripe.refund", {"amount": True, "currency": "usd"}, DENY, "no_matching_rule"),
        ("stripe.refund", {"amount": "100", "currency": "usd"}, DENY, "no_matching_rule"),
        ("stripe.refund", {"amount": 100.0, "currency": "usd"}, DENY, "no_matching_rule"),
        ("stripe.refund", {"amount": None, "currency": "usd"}, DENY, "no_matching_rule"),
        # eq/in are type-strict
        ("stripe.refund", {"amount": 1, "currency": ["usd"]}, DENY, "no_matching_rule"),
        ("stripe.refund", {"amount": 10**6, "reason": "Fraud"}, DENY, "no_matching_rule"),
        # first match wins; a rule without when always matches
        ("k8s.scale", {"namespace": "default", "replicas": 3}, ALLOW, "rule[0]"),
        ("k8s.scale", {"namespace": "kube-system", "replicas": 3}, DENY, "rule[1]"),
        ("k8s.scale", {"namespace": "default", "replicas": 21}, DENY, "rule[1]"),
        ("k8s.scale", {"replicas": 3}, DENY, "rule[1]"),  # neq on a missing argument: false
        ("flags.set", {"enabled": True}, APPROVE, "rule[0]"),
        ("flags.set", {"enabled": False}, ALLOW, "rule[1]"),
        ("flags.set", {"enabled": 1}, DENY, "no_matching_rule"),
        ("flags.set", {"enabled": 0}, DENY, "no_matching_rule"),
        ("flags.set", {"enabled": "true"}, DENY, "no_matching_rule"),
        ("meta.tag", {"labels": {"team": "pay", "tiers": [1, 2]}}, ALLOW, "rule[0]"),
        ("meta.tag", {"labels": {"tiers": (1, 2), "team": "pay"}}, ALLOW, "rule[0]"),
        ("meta.tag", {"labels": {"team": "pay", "tiers": [2, 1]}}, DENY, "no_matching_rule"),
        ("meta.tag", {"labels": {"team": "pay", "tiers": [True, 2]}}, DENY, "no_matching_rule"),
        ("meta.tag", {"labels": {"team": "pay"}}, DENY, "no_matching_rule"),
        ("meta.tag", {"owner": None}, DENY, "rule[1]"),
        ("meta.tag", {"owner": ""}, DENY, "no_matching_rule"),
        ("meta.tag", {"level": 1}, APPROVE, "rule[2]"),
        ("meta.tag", {"level": "2"}, APPROVE, "rule[2]"),
        ("meta.tag", {"level": True}, APPROVE, "rule[2]"),
        ("meta.tag", {"level": 2}, DENY, "no_matching_rule"),
        ("meta.tag", {"level": "1"}, DENY, "no_matching_rule"),
        ("ops.reboot", {}, APPROVE, "decision"),
        ("ops.delete", {"anything": 1}, DENY, "decision"),
        ("ops.ping", {}, ALLOW, "decision"),
        ("ops.unknown", {}, DENY, "unknown_action"),
        ("Ops.Ping", {}, DENY, "unknown_action"),  # exact names: no case folding
        ("ops.*", {}, DENY, "unknown_action"),  # and no globs
        ("", {}, DENY, "unknown_action"),
    ],
)
def test_evaluate(
    policy: Policy, name: str, arguments: dict[str, Any], decision: Decision, reason: str
) -> None:
    assert policy.evaluate(name, arguments) == Evaluation(decision, reason)


def test_empty_actions_deny_everything() -> None:
    policy = Policy.from_yaml("schema: ctrlrun.policy/v1\nactions: {}\n")
    assert policy.evaluate("stripe.refund", {"amount": 1}) == Evaluation(DENY, "unknown_action")
    assert dict(policy.actions) == {}
    assert dict(policy.sections) == {"operators": {}}  # the kernel's own sections, empty
    assert policy.mode == "enforce"
    assert policy.schema == "ctrlrun.policy/v1"


def test_accessors(policy: Policy) -> None:
    effect = policy.effect_template("stripe.refund")
    resource = policy.resource_template("stripe.refund")
    assert effect is not None and effect.text == "refund:{payment_id}"
    assert effect.names == ("payment_id",)
    assert resource is not None and resource.resolve({"payment_id": "pi_1"}) == "payment:pi_1"
    assert policy.effect_template("ops.ping") is None
    assert policy.resource_template("k8s.scale") is None
    assert policy.effect_template("nope") is None
    assert policy.window("stripe.refund") == timedelta(minutes=10)
    assert policy.window("k8s.scale") is None
    assert policy.window("nope") is None
    assert policy.actions_without_effect() == [
        "flags.set",
        "meta.tag",
        "ops.delete",
        "ops.ping",
        "ops.reboot",
    ]
    assert list(policy.actions) == [
        "stripe.refund",
        "k8s.scale",
        "flags.set",
        "meta.tag",
        "ops.reboot",
        "ops.delete",
        "ops.ping",
    ]
    assert policy.source == "<string>"
    assert policy.path is None


def test_actions_are_read_only(policy: Policy) -> None:
    with pytest.raises(TypeError):
        policy.actions["ops.new"] = policy.actions["ops.ping"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("10m", timedelta(minutes=10)),
        ("1h", timedelta(hours=1)),
        ("2d", timedelta(days=2)),
        ("90", None),
        (90, timedelta(seconds=90)),
        ("1", None),
    ],
)
def test_window(window: object, expected: timedelta | None) -> None:
    text = (
        f"schema: ctrlrun.policy/v2\nactions:\n  a:\n    decision: allow\n    window: {window!r}\n"
    )
    if expected is None:  # a quoted number is a string without a unit
        with pytest.raises(PolicyError, match=r"actions\.a\.window"):
            Policy.from_yaml(text)
    else:
        assert Policy.from_yaml(text).window("a") == expected


@pytest.mark.parametrize(
    ("text", "mode"),
    [("", "enforce"), ("mode: enforce\n", "enforce"), ("mode: observe\n", "observe")],
)
def test_mode(text: str, mode: str) -> None:
    policy = Policy.from_yaml("schema: ctrlrun.policy/v2\nactions: {}\n" + text)
    assert policy.mode == mode


def test_v1_policy_without_v2_keys_loads() -> None:
    policy = Policy.from_yaml(
        "schema: ctrlrun.policy/v1\nactions:\n  a:\n    rules:\n      - when: {n_lt: 3}\n"
        "        decision: allow\n"
    )
    assert policy.evaluate("a", {"n": 2}) == Evaluation(ALLOW, "rule[0]")
    assert policy.effect_template("a") is None


def test_quoted_dates_and_yaml_12_booleans_are_strings() -> None:
    policy = Policy.from_yaml(
        "schema: ctrlrun.policy/v2\nactions:\n  a:\n    rules:\n"
        "      - when: {day_eq: '2024-01-01', answer_eq: yes, on_eq: off}\n"
        "        decision: allow\n"
    )
    arguments = {"day": "2024-01-01", "answer": "yes", "on": "off"}
    assert policy.evaluate("a", arguments).decision is ALLOW
    assert policy.evaluate("a", {**arguments, "answer": True}).decision is DENY


def test_policy_hash_covers_parsed_content_not_bytes() -> None:
    base = Policy.from_yaml("schema: ctrlrun.policy/v2\nactions:\n  a: {decision: allow}\n")
    same = Policy.from_yaml(
        "# a comment\nactions:\n  a:\n    decision: allow   # inline\n\nschema: ctrlrun.policy/v2\n"
    )
    other = Policy.from_yaml("schema: ctrlrun.policy/v2\nactions:\n  a: {decision: deny}\n")
    document = {"schema": "ctrlrun.policy/v2", "actions": {"a": {"decision": "allow"}}}
    assert base.policy_hash == same.policy_hash == sha256(canonical_bytes(document))
    assert base.policy_hash != other.policy_hash
    assert base.policy_hash.startswith("sha256:") and len(base.policy_hash) == 71


def test_anchors_and_merge_keys_work() -> None:
    policy = Policy.from_yaml(
        "schema: ctrlrun.policy/v2\nactions:\n"
        "  a: &base {effect: 'x:{id}', decision: allow}\n"
        "  b: {<<: *base, decision: deny}\n"
    )
    assert policy.evaluate("b", {}) == Evaluation(DENY, "decision")
    template = policy.effect_template("b")
    assert template is not None and template.text == "x:{id}"


def test_evaluation_logs_a_warning_for_a_missing_argument(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = Policy.from_yaml(POLICY)  # a fresh one: each condition warns only once
    with caplog.at_level("WARNING"):
        policy.evaluate("stripe.refund", {"currency": "usd", "card_number": "4242"})
    assert "no argument 'amount'" in caplog.text
    assert "card_number" in caplog.text  # names, never values
    assert "4242" not in caplog.text


# ---------------------------------------------------------------- from_file resolution

GOOD = "schema: ctrlrun.policy/v2\nactions:\n  {name}: {{decision: allow}}\n"


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    monkeypatch.delenv("CTRLRUN_CONFIG", raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    paths = {"cwd": cwd / "ctrlrun.yaml", "env": tmp_path / "env.yaml", "arg": tmp_path / "a.yaml"}
    for name, path in paths.items():
        path.write_text(GOOD.format(name=name))
    monkeypatch.chdir(cwd)
    return paths


@pytest.mark.parametrize(
    ("explicit", "env", "winner"),
    [
        (True, True, "arg"),
        (True, False, "arg"),
        (False, True, "env"),
        (False, False, "cwd"),
    ],
)
def test_from_file_resolution_order(
    files: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    explicit: bool,
    env: bool,
    winner: str,
) -> None:
    if env:
        monkeypatch.setenv("CTRLRUN_CONFIG", str(files["env"]))
    policy = Policy.from_file(files["arg"] if explicit else None)
    assert list(policy.actions) == [winner]
    assert policy.path == files[winner].absolute()
    assert policy.source == str(files[winner])


def test_from_file_accepts_a_relative_path_and_records_it_absolute(files: dict[str, Path]) -> None:
    policy = Policy.from_file("ctrlrun.yaml")
    assert policy.source == "ctrlrun.yaml"
    assert policy.path == files["cwd"]
    assert policy.path.is_absolute()


@pytest.mark.parametrize("blank", ["", "  "])
def test_blank_ctrlrun_config_is_an_error(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, blank: str
) -> None:
    monkeypatch.setenv("CTRLRUN_CONFIG", blank)
    with pytest.raises(PolicyError, match="CTRLRUN_CONFIG is set but empty"):
        Policy.from_file()


@pytest.mark.parametrize(("where", "hint"), [("env", "CTRLRUN_CONFIG"), ("cwd", "default")])
def test_missing_file_names_the_path(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, where: str, hint: str
) -> None:
    files[where].unlink()
    if where == "env":
        monkeypatch.setenv("CTRLRUN_CONFIG", str(files["env"]))
    with pytest.raises(PolicyError) as info:
        Policy.from_file()
    message = str(info.value)
    assert message.startswith(f"policy file {files[where]} could not be read")
    assert hint in message and "\n" not in message


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.floats(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(["stripe.refund", "k8s.scale", "flags.set", "meta.tag", "ops.ping", "x"]),
    arguments=st.dictionaries(
        st.sampled_from(
            [
                "amount",
                "currency",
                "reason",
                "namespace",
                "replicas",
                "enabled",
                "labels",
                "owner",
                "level",
                "other",
            ]
        ),
        JSON,
    ),
)
def test_evaluate_never_raises_and_is_deterministic(name: str, arguments: dict[str, Any]) -> None:
    policy = Policy.from_yaml(POLICY)
    first = policy.evaluate(name, arguments)
    assert first == policy.evaluate(name, dict(reversed(list(arguments.items()))))
    assert first.decision in set(Decision)
    assert first.reason in {"decision", "no_matching_rule", "unknown_action"} or (
        first.reason.startswith("rule[") and first.reason.endswith("]")
    )
