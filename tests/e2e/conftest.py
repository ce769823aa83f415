"""Fixtures for the end-to-end tests; the harness itself is ``harness.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Sidecar, fake_remotes, running_sidecar

from ctrlrun.testing import FakeKubernetes, FakeStripe


@pytest.fixture
def fakes() -> Iterator[tuple[FakeStripe, FakeKubernetes]]:
    with fake_remotes("checkout") as both:
        yield both


@pytest.fixture
def sidecar(tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[Sidecar]:
    """The proxy in this process (``inprocess.py``), for tests of what it decides."""
    with running_sidecar(tmp_path, *fakes, in_process=True) as sc:
        yield sc


@pytest.fixture
def sidecar_command(tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[Sidecar]:
    """``ctrlrun proxy`` as a subprocess: the command exactly as an operator runs it."""
    with running_sidecar(tmp_path, *fakes) as sc:
        yield sc
