"""Fixtures for the reconciler tests: the real fake remotes on loopback, and a closed port."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from ctrlrun.testing import FakeKubernetes, FakeStripe


@pytest.fixture
def stripe_fake() -> Iterator[FakeStripe]:
    with FakeStripe() as fake:
        yield fake


@pytest.fixture
def kube_fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as fake:
        yield fake


@pytest.fixture
def closed_url() -> str:
    """A loopback URL where nothing listens: connecting is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
