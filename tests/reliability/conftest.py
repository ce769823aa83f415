"""Fixtures for the failure suite: fake remotes, throwaway PostgreSQL databases, and running
sidecars (the real ``ctrlrun proxy``, started by the end-to-end harness in tests/e2e)."""

from __future__ import annotations

import secrets
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.harness import Sidecar, start_sidecar

from ctrlrun.testing import FakeKubernetes, FakeStripe

PG_SERVER = "postgresql://postgres@127.0.0.1:5432"


def pg_admin() -> Any:
    """An autocommit connection to the server's ``test`` database; skips when none answers."""
    import psycopg

    try:
        return psycopg.connect(f"{PG_SERVER}/test", autocommit=True, connect_timeout=3)
    except psycopg.Error:
        pytest.skip("PostgreSQL is not answering on 127.0.0.1:5432 (user postgres, database test)")


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database ``ctrlrun_t_<random>``, dropped after the test."""
    name = f"ctrlrun_t_{secrets.token_hex(6)}"
    with pg_admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_SERVER}/{name}"
    finally:
        with pg_admin() as admin:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def fakes() -> Iterator[tuple[FakeStripe, FakeKubernetes]]:
    with FakeStripe(hang_seconds=5) as stripe, FakeKubernetes(hang_seconds=5) as kube:
        yield stripe, kube


@pytest.fixture
def sidecars(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Sidecar]]:
    """``start(stripe, kube, workdir=None, **start_sidecar options)``; all killed afterwards."""
    started: list[Sidecar] = []

    def start(
        stripe: FakeStripe, kube: FakeKubernetes, workdir: Path | None = None, **kw: Any
    ) -> Sidecar:
        where = workdir or tmp_path_factory.mktemp("sidecar")
        for attempt in range(3):
            try:
                sc = start_sidecar(where, stripe, kube, **kw)
            except AssertionError:
                # free_port() hands out a port that another sidecar started in parallel may
                # take first; a start that keeps failing is still a failure.
                if attempt == 2:
                    raise
                continue
            started.append(sc)
            return sc
        raise AssertionError("unreachable")

    yield start
    for sc in started:
        sc.stop(signal.SIGKILL)
