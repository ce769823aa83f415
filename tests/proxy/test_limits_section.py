"""The ``limits:`` section: defaults, values, and bad values as one line naming the key."""

from __future__ import annotations

import pytest

from ctrlrun.errors import PolicyError
from ctrlrun.proxy.config_parse import policy_from_yaml, proxy_config
from ctrlrun.proxy.limits import Limits

HEAD = "schema: ctrlrun.policy/v2\nactions: {}\n"


def test_limits_default_and_parse() -> None:
    assert proxy_config(policy_from_yaml(HEAD)).limits == Limits(30.0, 60.0, 20)
    text = HEAD + "limits: {request_head_timeout: 5, pending_approvals_per_agent: 3}\n"
    assert proxy_config(policy_from_yaml(text)).limits == Limits(5.0, 60.0, 3)


@pytest.mark.parametrize(
    ("section", "words"),
    [
        ("limits: {request_head_timeout: 0}", "request_head_timeout: must be a positive integer"),
        ("limits: {request_body_timeout: 1.5}", "request_body_timeout"),
        ("limits: {pending_approvals_per_agent: true}", "pending_approvals_per_agent"),
        ("limits: {queue: 3}", "queue"),
    ],
)
def test_a_bad_limit_is_one_line_naming_the_key(section: str, words: str) -> None:
    with pytest.raises(PolicyError) as info:
        policy_from_yaml(HEAD + section + "\n")
    assert words in str(info.value) and "\n" not in str(info.value)
