"""Fixtures for the end-to-end tests; the harness itself is ``harness.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from harness import Sidecar, fake_remotes, running_sidecar

from ctrlrun.testing import FakeKubernetes, FakeStripe

if TYPE_CHECKING:
    from ctrlrun.testing.stripe_mcp import FakeStripeMcp


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


@pytest.fixture
def mcp_server(fakes: tuple[FakeStripe, FakeKubernetes]) -> Iterator[FakeStripeMcp]:
    """Stripe's MCP server (the fake, answering JSON) over the fake Stripe; a module may
    override it (another server, other settings) and keep ``mcp_sidecar``."""
    from ctrlrun.testing.stripe_mcp import FakeStripeMcp

    with FakeStripeMcp(fakes[0], json_response=True) as server:
        yield server


@pytest.fixture
def mcp_sidecar(
    tmp_path: Path, fakes: tuple[FakeStripe, FakeKubernetes], mcp_server: FakeStripeMcp
) -> Iterator[Sidecar]:
    """The proxy in this process guarding ``mcp_server`` (``mcp_support.POLICY``)."""
    from mcp_support import POLICY

    text = POLICY.format(mcp=mcp_server.url)
    with running_sidecar(tmp_path, *fakes, policy_text=text, in_process=True) as sc:
        yield sc
