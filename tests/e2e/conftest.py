"""Fixtures for the end-to-end tests; the harness itself is ``harness.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Sidecar, start_sidecar

from ctrlrun.testing import FakeKubernetes, FakeStripe


@pytest.fixture
def fakes() -> Iterator[tuple[FakeStripe, FakeKubernetes]]:
    with FakeStripe() as stripe, FakeKubernetes() as kube:
        kube.add_deployment(namespace="default", name="checkout", replicas=3)
        yield stripe, kube


@pytest.fixture
def sidecar(tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[Sidecar]:
    """The proxy in this process (``inprocess.py``), for tests of what it decides."""
    stripe, kube = fakes
    sc = start_sidecar(tmp_path, stripe, kube, in_process=True)
    try:
        yield sc
    finally:
        sc.stop()


@pytest.fixture
def sidecar_command(tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[Sidecar]:
    """``ctrlrun proxy`` as a subprocess: the command exactly as an operator runs it."""
    stripe, kube = fakes
    sc = start_sidecar(tmp_path, stripe, kube)
    try:
        yield sc
    finally:
        sc.stop()
