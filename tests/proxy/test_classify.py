"""Outcome classification: the DESIGN.md table, row by row, for every profile."""

from __future__ import annotations

import json
import typing

import pytest

from ctrlrun.proxy.classify import Outcome, Transport, classify

C: Outcome = "committed"
F: Outcome = "failed"
A: Outcome = "ambiguous"
PROFILES = [("stripe", "stripe.refund"), ("kubernetes", "k8s.scale"), ("http", "billing.send")]

STATUS_ROWS = [
    (200, C),
    (201, C),
    (202, C),
    (204, C),
    (400, F),
    (401, F),
    (402, F),  # Stripe card_error: a definite refusal
    (403, F),
    (404, F),
    (408, A),
    (409, F),
    (410, F),
    (422, F),
    (424, A),
    (429, F),
    (500, A),
    (502, A),
    (503, A),
    (504, A),
    (599, A),
    (100, A),
    (301, A),
    (304, A),
    (0, A),
    (999, A),
]


@pytest.mark.parametrize(("profile", "action"), PROFILES)
@pytest.mark.parametrize(("status", "expected"), STATUS_ROWS)
def test_status(profile: str, action: str, status: int, expected: Outcome) -> None:
    if (profile, status) == ("stripe", 409):
        expected = A  # idempotency_key_in_use: the other request with the key may apply it
    assert classify(profile, action, status=status, transport=None) == expected


@pytest.mark.parametrize(("profile", "action"), PROFILES)
@pytest.mark.parametrize(
    ("transport", "expected"),
    [(Transport.NOT_SENT, F), (Transport.SENT_NO_STATUS, A), (None, A)],
)
def test_no_status(
    profile: str, action: str, transport: Transport | None, expected: Outcome
) -> None:
    assert classify(profile, action, status=None, transport=transport) == expected


@pytest.mark.parametrize(("status", "expected"), [(200, C), (404, F), (500, A)])
def test_a_status_line_decides_even_if_the_body_was_cut(status: int, expected: Outcome) -> None:
    outcome = classify("stripe", "stripe.refund", status=status, transport=Transport.SENT_NO_STATUS)
    assert outcome == expected


def _status(message: str, code: int = 409) -> bytes:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
    return json.dumps({**body, "reason": "Conflict", "code": code}).encode()


TERMINATING = _status(
    'Operation cannot be fulfilled on namespaces "prod": The system is ensuring all content is '
    "removed from this namespace.  Upon completion, this namespace will automatically be "
    "purged by the system."
)
PRECONDITION = _status(
    'Operation cannot be fulfilled on namespaces "prod": Precondition failed: UID in '
    "precondition: 1, UID in object meta: 2"
)


@pytest.mark.parametrize(
    ("profile", "action", "body", "expected"),
    [
        ("kubernetes", "k8s.delete_namespace", TERMINATING, C),
        ("kubernetes", "k8s.delete_namespace", _status('namespace "prod" is terminating'), C),
        ("kubernetes", "k8s.delete_namespace", _status("the object is being deleted"), C),
        ("kubernetes", "k8s.delete_namespace", PRECONDITION, F),
        ("kubernetes", "k8s.delete_namespace", b"", F),
        ("kubernetes", "k8s.delete_namespace", b"\xff{", F),
        ("kubernetes", "k8s.delete_namespace", b'["terminating"]', F),
        ("kubernetes", "k8s.delete_namespace", b'{"message": "is terminating"}', F),
        ("kubernetes", "k8s.delete_namespace", b'{"kind": "Status", "message": 7}', F),
        ("kubernetes", "k8s.delete_deployment", TERMINATING, F),
        ("kubernetes", "k8s.scale", TERMINATING, F),
        ("stripe", "k8s.delete_namespace", TERMINATING, A),  # any Stripe 409: key in use
        ("http", "k8s.delete_namespace", TERMINATING, F),
    ],
)
def test_namespace_409_refinement(
    profile: str, action: str, body: bytes, expected: Outcome
) -> None:
    assert classify(profile, action, status=409, transport=None, body=body) == expected


def test_outcomes_are_the_kernels() -> None:
    # classify returns exactly what Control.finish records: one Outcome, the kernel's.
    from ctrlrun.control import Outcome as KernelOutcome

    assert Outcome is KernelOutcome
    assert typing.get_args(Outcome) == ("committed", "failed", "ambiguous")
    assert [t.value for t in Transport] == ["not_sent", "sent_no_status"]
