"""An independent model of admission, written from DESIGN.md, for the tests to check against.

It knows nothing of ``ctrlrun.admission`` or the transition table: a scenario is plain values
(the record's state as a string, the lease as "live"/"expired", ...) and the expectation is
what DESIGN.md's table and approval rules say a new attempt gets, as plain strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

RECORDS = (None, "executing", "committed", "failed", "ambiguous", "reserved")
LEASES = ("live", "ends_now", "expired", "none")
AGES = ("inside", "at_window", "past")  # a committed record's age against a 10 minute window
STATUSES = (None, "pending", "granted", "denied", "expired", "consumed")  # None: unknown id
EXPIRIES = ("future", "now", "past")
DECISIONS = ("allow", "approve", "deny")
MODES = ("enforce", "observe")
HEAD = ("ACTION_PROPOSED", "POLICY_EVALUATED")


@dataclass(frozen=True)
class Scenario:
    """One admission, as plain values."""

    decision: str = "allow"
    mode: str = "enforce"
    keyed: bool = True
    record: str | None = None
    lease: str = "live"
    attempt: int = 1  # the record's attempt number
    window: bool = False  # the action has a 10 minute window
    age: str = "inside"
    presented: bool = False  # an approval id is presented
    status: str | None = "granted"  # the presented approval's status (None: no such approval)
    same_hash: bool = True  # the approval was granted for this very action
    expiry: str = "future"  # the approval's expiry against now
    may_reconcile: bool = False
    announced: bool = False


@dataclass(frozen=True)
class Expect:
    """What the model says happens."""

    outcome: str  # denied, approval_required, approval_denied, approval_mismatch:<why>,
    # duplicate, in_progress, ambiguous, reconcile_first, reserve:<attempt>, run
    events: tuple[str, ...]
    receipt: str | None = None  # the refusal's receipt result
    record: tuple[str, int] | None = None  # (state, attempt) afterwards; None: no record
    approval: str | None = None  # the presented (or requested) approval's status afterwards
    blocked: str | None = None  # observe mode: why enforcement would have refused
    extra: dict[str, str] = field(default_factory=dict, compare=False)


def expect(s: Scenario) -> Expect:
    """What DESIGN.md says this attempt gets."""
    head = () if s.announced else HEAD
    untouched = s.status if s.presented else None
    if s.mode == "observe":
        blocked = None
        if s.decision == "approve":
            blocked = "approval_required"
        elif s.decision == "deny":
            blocked = "decision"
        return _by_record(s, head, False, blocked, untouched)
    if s.decision == "deny":
        return Expect("denied", (*head, "ACTION_DENIED"), "denied", _record(s), untouched)
    if s.decision == "allow":
        return _by_record(s, head, False, None, untouched)
    if not s.presented:
        return Expect("approval_required", (*head, "APPROVAL_REQUESTED"), None, _record(s), "new")
    why = _approval_problem(s)
    if why is None:
        return _by_record(s, head, True, None, untouched)
    expire = why == "expired" and s.status == "granted"
    events = (*head, *(("APPROVAL_EXPIRED",) if expire else ()), "APPROVAL_INVALIDATED")
    after = "expired" if expire else s.status
    if why == "denied":
        return Expect("approval_denied", events, "denied", _record(s), after)
    return Expect(f"approval_mismatch:{why}", events, "blocked", _record(s), after)


def _approval_problem(s: Scenario) -> str | None:
    if s.status is None:
        return "unknown"
    if not s.same_hash:
        return "mismatch"
    if s.status != "granted":
        return s.status  # denied, pending, expired, consumed
    return "expired" if s.expiry == "past" else None


def _record(s: Scenario) -> tuple[str, int] | None:
    return None if s.record is None or not s.keyed else (s.record, s.attempt)


def _by_record(
    s: Scenario, head: tuple[str, ...], consume: bool, blocked: str | None, untouched: str | None
) -> Expect:
    consumed = ("APPROVAL_CONSUMED",) if consume else ()
    spent = "consumed" if consume else untouched
    if not s.keyed:
        return Expect("run", (*head, *consumed, "EXECUTION_STARTED"), None, None, spent, blocked)
    standing = _standing(s)
    if standing in ("new", "renew"):
        number = 1 if standing == "new" else s.attempt + 1
        events = (*head, *consumed, "EFFECT_RESERVED", "EXECUTION_STARTED")
        return Expect(f"reserve:{number}", events, None, ("executing", number), spent, blocked)
    expired = standing == "expired_lease"
    before = ("EXECUTION_AMBIGUOUS",) if expired else ()
    record = ("ambiguous", s.attempt) if expired else _record(s)
    kind = "ambiguous" if expired else standing
    if kind == "ambiguous" and s.may_reconcile:
        return Expect("reconcile_first", (*head, *before), None, record, untouched)
    if s.mode == "observe":
        events = (*head, *before, "EXECUTION_STARTED")
        return Expect("run", events, None, record, untouched, blocked or kind)
    events = (*head, *before, "EFFECT_RESERVATION_REFUSED")
    return Expect(kind, events, "blocked", record, untouched)


def _standing(s: Scenario) -> str:
    """What the key's record lets a new attempt do (DESIGN.md, "Effect states")."""
    if s.record is None:
        return "new"
    if s.record == "failed":
        return "renew"
    if s.record == "committed":
        return "renew" if s.window and s.age in ("at_window", "past") else "duplicate"
    if s.record == "ambiguous":
        return "ambiguous"
    # executing (or reserved): held while the lease lives, the lease's last instant included
    return "in_progress" if s.lease in ("live", "ends_now") else "expired_lease"


def after_reconcile(s: Scenario, answer: str) -> Scenario:
    """The scenario a re-plan sees once a lazy reconcile hook answered ``answer``."""
    moved = {"committed": "committed", "not_executed": "failed"}.get(answer, "ambiguous")
    # A committed answer starts the window now: the record is young again.
    return replace(s, record=moved, age="inside", may_reconcile=False, announced=True)
