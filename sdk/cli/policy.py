"""Policy files: ``init`` writes one, ``policy check`` validates one."""

from __future__ import annotations

from pathlib import Path

import click

from .common import errors, fail


@click.command()
@click.option("--force", is_flag=True, help="Overwrite an existing ctrlrun.yaml.")
@errors
def init(force: bool) -> None:
    """Write a starter ctrlrun.yaml (policy + upstreams) in the current directory.

    Example: ctrlrun init && ctrlrun policy check ctrlrun.yaml
    """
    from ctrlrun.starter import STARTER_POLICY

    path = Path("ctrlrun.yaml")
    if path.exists() and not force:
        fail(f"{path} already exists; use --force to overwrite it", 1)
    path.write_text(STARTER_POLICY, encoding="utf-8")
    state = Path(".ctrlrun")
    state.mkdir(exist_ok=True)
    click.echo(f"wrote {path}")
    click.echo(f"created {state}/")


@click.group()
def policy() -> None:
    """Work with policy files."""


@policy.command("check")
@click.argument("file", type=click.Path(dir_okay=False), default="ctrlrun.yaml")
@errors
def policy_check(file: str) -> None:
    """Validate a policy file; list actions with no effect: template (no deduplication).

    Example: ctrlrun policy check ctrlrun.yaml
    """
    # The file carries the proxy's sections too; they are checked with the rest.
    from ctrlrun.proxy.config_parse import load_policy, proxy_config

    loaded = load_policy(file)
    click.echo(
        f"{file}: ok ({loaded.schema}, {len(loaded.actions)} actions, "
        f"{len(proxy_config(loaded).upstreams)} upstreams, mode {loaded.mode})"
    )
    for name in loaded.actions_without_effect():
        click.echo(f"warning: {name} has no effect: template; its writes cannot be deduplicated")
