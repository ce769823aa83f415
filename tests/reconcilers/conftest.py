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
def closed_url() -> Iterator[str]:
    """A loopback URL where nothing listens: connecting is refused.

    The port stays bound (never listening) for the test, so nothing else can take it meanwhile.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
