"""Where the policy and the ledger are: the one module that reads the environment."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import InvalidArgument, PolicyError

if TYPE_CHECKING:
    from .control import Control
    from .policy import Policy
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


def load_policy(path: str | os.PathLike[str] | None = None) -> Policy:
    from .policy import Policy

    return Policy.from_file(policy_path(path))


def default_control(path: str | os.PathLike[str] | None = None) -> Control:
    """A Control on the configured policy and ledger."""
    from .control import Control

    resolved = policy_path(path)
    policy = load_policy(resolved)
    environment = os.environ.get("CTRLRUN_ENVIRONMENT") or "production"
    return Control(policy, open_default_store(None, resolved), environment=environment)


_default: Control | None = None
_default_lock = threading.Lock()


def process_control() -> Control:
    """The process-wide Control that ``protect`` uses when none is given (built on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = default_control()
        return _default
