"""Where the policy and the ledger are: the one module that reads the environment.

It imports nothing that builds on it (the policy, the Control), so every module may use it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import InvalidArgument, PolicyError

if TYPE_CHECKING:
    from .store import StateStore


def policy_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """explicit path -> ``$CTRLRUN_CONFIG`` -> ``./ctrlrun.yaml``."""
    if explicit is not None:
        return Path(explicit)
    env = os.environ.get("CTRLRUN_CONFIG")
    if env is not None:
        if not env.strip():
            raise PolicyError("CTRLRUN_CONFIG is set but empty; unset it or name a policy file")
        return Path(env)
    return Path.cwd() / "ctrlrun.yaml"


def store_url(explicit: str | None = None, policy: str | os.PathLike[str] | None = None) -> str:
    """``--store-url`` -> ``$CTRLRUN_STORE_URL`` -> ``$CTRLRUN_STATE`` -> beside the policy."""
    if explicit:
        return explicit
    url = os.environ.get("CTRLRUN_STORE_URL")
    if url is not None and url.strip():
        return url.strip()
    state = os.environ.get("CTRLRUN_STATE")
    if state is not None:
        if not state.strip():
            raise InvalidArgument("CTRLRUN_STATE is set but empty; unset it or name a SQLite file")
        return f"sqlite:///{Path(state).resolve()}"
    base = policy_path(policy).resolve().parent
    return f"sqlite:///{base / '.ctrlrun' / 'state.db'}"


def open_default_store(
    explicit: str | None = None,
    policy: str | os.PathLike[str] | None = None,
    *,
    create: bool = True,
) -> StateStore:
    from .store import open_store

    return open_store(store_url(explicit, policy), create=create)


def environment() -> str:
    """``$CTRLRUN_ENVIRONMENT``, recorded with every action (default ``production``)."""
    return os.environ.get("CTRLRUN_ENVIRONMENT") or "production"
