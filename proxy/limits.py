"""The ``limits:`` section: what keeps one agent from drowning the proxy or the humans.

    limits:
      request_head_timeout: 30          # seconds for a request's head to arrive, from the
                                        # connection's start or the previous answer
      request_body_timeout: 60          # seconds for its body to arrive, once the head has
      pending_approvals_per_agent: 20   # past it, a request needing approval is refused

Every key is optional; the values above are the defaults. A connection that stalls is
closed, so a slowloris of many connections holds none of them for long.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctrlrun.yamlstrict import Where, check_keys, expect_map, show

LIMIT_KEYS = ("request_head_timeout", "request_body_timeout", "pending_approvals_per_agent")


@dataclass(frozen=True)
class Limits:
    """Timeouts for stalled requests and the cap on an agent's pending approvals."""

    request_head_timeout: float = 30.0
    request_body_timeout: float = 60.0
    pending_approvals_per_agent: int = 20


def parse_limits(value: Any, where: Where) -> Limits:
    entry = expect_map(value, where)
    check_keys(entry, where, LIMIT_KEYS)
    numbers: dict[str, int] = {}
    for key in LIMIT_KEYS:
        if key not in entry:
            continue
        number = entry[key]
        if isinstance(number, bool) or not isinstance(number, int) or number <= 0:
            raise where.key(entry, key).error(f"must be a positive integer, got {show(number)}")
        numbers[key] = number
    defaults = Limits()
    return Limits(
        float(numbers.get("request_head_timeout", defaults.request_head_timeout)),
        float(numbers.get("request_body_timeout", defaults.request_body_timeout)),
        numbers.get("pending_approvals_per_agent", defaults.pending_approvals_per_agent),
    )
