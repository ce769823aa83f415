"""Rule conditions: ``<argument>_<op>: operand``, parsed once and evaluated purely.

Seven operators: ``eq``, ``neq``, ``in`` compare with type-strict equality (``True != 1``, a
list never equals a scalar); ``lt``, ``lte``, ``gt``, ``gte`` compare integers only. A missing
argument makes a condition false, whatever the operator; so does a numeric operator meeting
an argument that is not an integer. Each of those two says so in one WARNING per condition of
the policy (naming where it is written), not on every evaluation.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .yamlstrict import Where, YamlList, YamlMap, check_plain, plain, show

logger = logging.getLogger(__name__)

# Names that mean something else to the reference library (who is asking, where, which record),
# or that a later schema derives; a policy must never confuse them with an argument.
RESERVED_SUBJECTS = frozenset(
    {
        "action_id",
        "agent",
        "claims",
        "data_scope",
        "environment",
        "expires_at",
        "issuer",
        "principal",
        "resource",
        "user",
    }
)


class Op(StrEnum):
    """A condition operator."""

    EQ = "eq"
    NEQ = "neq"
    IN = "in"
    LT = "lt"
    LTE = "lte"
    GT = "gt"
    GTE = "gte"


NUMERIC_OPS = frozenset({Op.LT, Op.LTE, Op.GT, Op.GTE})
_OPS_TEXT = ", ".join(op.value for op in Op)


@dataclass(frozen=True)
class Condition:
    """One ``<subject>_<op>: operand`` test on the arguments of an action."""

    subject: str
    op: Op
    operand: Any  # int for numeric ops, a tuple for ``in``, plain JSON-like data otherwise
    origin: str = field(default="", compare=False)  # where the policy writes it (key path)
    # The warnings already given for this condition: each is said once, not per evaluation.
    _warned: set[str] = field(default_factory=set, compare=False, repr=False)

    @property
    def key(self) -> str:
        return f"{self.subject}_{self.op.value}"

    def holds(self, arguments: Mapping[str, Any]) -> bool:
        """Whether the condition is true of ``arguments``."""
        if self.subject not in arguments:
            if "missing" not in self._warned:
                self._warned.add("missing")
                logger.warning(
                    "condition %s is false: no argument %r (arguments: %s); said once",
                    self.origin or self.key,
                    self.subject,
                    ", ".join(sorted(arguments)) or "none",
                )
            return False
        value = arguments[self.subject]
        if self.op is Op.EQ:
            return strict_equal(value, self.operand)
        if self.op is Op.NEQ:
            return not strict_equal(value, self.operand)
        if self.op is Op.IN:
            return any(strict_equal(value, item) for item in self.operand)
        if isinstance(value, bool) or not isinstance(value, int):
            if "not_int" not in self._warned:
                self._warned.add("not_int")
                logger.warning(
                    "condition %s is false: argument %r is a %s, not an integer; said once",
                    self.origin or self.key,
                    self.subject,
                    type(value).__name__,
                )
            return False
        bound: int = self.operand
        if self.op is Op.LT:
            return value < bound
        if self.op is Op.LTE:
            return value <= bound
        if self.op is Op.GT:
            return value > bound
        return value >= bound


def strict_equal(left: Any, right: Any) -> bool:
    """Equality that never crosses types: ``True != 1``, ``[1] != 1``, ``1 != 1.0``."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left is right
    if left is None or right is None:
        return left is None and right is None
    if isinstance(left, int) and isinstance(right, int):
        return left == right
    if isinstance(left, str) and isinstance(right, str):
        return left == right
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        return left.keys() == right.keys() and all(
            strict_equal(left[key], right[key]) for key in left
        )
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        return len(left) == len(right) and all(
            strict_equal(a, b) for a, b in zip(left, right, strict=True)
        )
    return False


def parse_conditions(when: Any, where: Where) -> tuple[Condition, ...]:
    """Parse a ``when:`` mapping; raise ``PolicyError`` naming the line of a bad condition."""
    if not isinstance(when, YamlMap):
        raise where.error(f"must be a mapping of conditions, got {show(when)}")
    if not when:
        raise where.error("must not be empty: leave 'when' out for a rule that always matches")
    return tuple(parse_condition(key, when[key], where.key(when, key)) for key in when)


def parse_condition(key: Any, operand: Any, where: Where) -> Condition:
    """Parse one ``<subject>_<op>: operand`` entry."""
    if not isinstance(key, str):
        raise where.error(f"condition {show(key)} is not a string: write <argument>_<op>")
    subject, underscore, op_name = key.rpartition("_")
    if not underscore or not subject:
        raise where.error(f"a condition is written <argument>_<op>, with <op> one of {_OPS_TEXT}")
    try:
        op = Op(op_name)
    except ValueError:
        raise where.error(f"unknown operator {op_name!r}; expected one of {_OPS_TEXT}") from None
    if subject in RESERVED_SUBJECTS:
        raise where.error(
            f"{subject!r} is reserved and cannot be a condition subject; conditions test "
            "the action's arguments only"
        )
    if op in NUMERIC_OPS:
        if isinstance(operand, bool) or not isinstance(operand, int):
            raise where.error(f"operand must be an integer, got {show(operand)}")
        return Condition(subject, op, operand, where.path)
    if op is Op.IN:
        if not isinstance(operand, YamlList):
            raise where.error(f"operand must be a list, got {show(operand)}")
        check_plain(operand, where)
        return Condition(subject, op, tuple(plain(operand)), where.path)
    check_plain(operand, where)
    return Condition(subject, op, plain(operand), where.path)
