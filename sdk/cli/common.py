"""What every command shares: one line for expected errors, the right exit code, the ledger."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click

from ctrlrun.errors import CTRLRunError, InvalidArgument, MissingDependency, PolicyError, StoreError
from ctrlrun.store import NoLedger, StateStore, open_default_store

F = TypeVar("F", bound=Callable[..., Any])
STORE_HELP = (
    "Ledger URL (sqlite:///PATH or postgresql://…). Default: $CTRLRUN_STORE_URL, "
    "$CTRLRUN_STATE, or .ctrlrun/state.db beside the policy."
)

store_option = click.option("--store-url", metavar="URL", help=STORE_HELP)
json_option = click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")


def fail(message: str, code: int) -> NoReturn:
    click.echo(f"ctrlrun: {message}", err=True)
    sys.exit(code)


def errors(fn: F) -> F:
    """Turn expected errors into one line on stderr and the right exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (PolicyError, InvalidArgument, StoreError, MissingDependency) as exc:
            fail(str(exc), 2)
        except CTRLRunError as exc:
            fail(str(exc), 1)

    return wrapper  # type: ignore[return-value]


def reader(store_url: str | None, policy_file: str | None = None) -> StateStore:
    """Open an existing ledger; never create one."""
    try:
        return open_default_store(store_url, policy_file, create=False)
    except NoLedger as exc:
        fail(f"{exc} (set --store-url or $CTRLRUN_STORE_URL, or run where ctrlrun.yaml is)", 1)


def say(text: str, *, as_json: bool) -> None:
    """A sentence for people: JSON output carries JSON lines only, so it is left out there."""
    if not as_json:
        click.echo(text)


operator_option = click.option(
    "--as",
    "as_name",
    metavar="NAME",
    help="Who is acting, as recorded (default: the OS user). With `operators:` in the policy, "
    "one of them.",
)


def operator(as_name: str | None, policy_file: str | None = None) -> str:
    """The operator acting: ``--as`` or the OS user, checked against the policy's list."""
    from ctrlrun.config import policy_path
    from ctrlrun.operators import OPERATORS, operator_name
    from ctrlrun.policy import Policy

    path = policy_path(policy_file)
    operators = Policy.from_file(path).section(OPERATORS) if path.is_file() else {}
    return operator_name(as_name, operators)
