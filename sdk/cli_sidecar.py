"""The sidecar's commands: ``proxy``, ``demo``, ``reconcile`` and ``policy check``.

They import the proxy lazily, so the kernel's CLI works without the ``proxy`` extra.
"""

from __future__ import annotations

import sys

import click

from .cli import errors, main, reader, store_option
from .errors import MissingDependency


@main.command()
@click.option(
    "--dir",
    "workdir",
    metavar="DIR",
    default=".ctrlrun/demo",
    show_default=True,
    help="Where the demo keeps its policy and ledger.",
)
@errors
def demo(workdir: str) -> None:
    """See ctrlrun work, offline, in under a minute: a real sidecar, fake Stripe and Kubernetes.

    Example: ctrlrun demo && ctrlrun receipts --store-url sqlite:///.ctrlrun/demo/state.db
    """
    try:
        from ctrlrun.proxy import demo as demo_module
    except ImportError as exc:
        raise MissingDependency("mitmproxy", "proxy") from exc
    sys.exit(demo_module.main(workdir))


@main.command()
@click.option(
    "--policy",
    "policy_file",
    metavar="FILE",
    help="Policy file (default: $CTRLRUN_CONFIG or ./ctrlrun.yaml).",
)
@click.option(
    "--listen",
    default="127.0.0.1:8080",
    show_default=True,
    metavar="HOST:PORT",
    help="Explicit proxy listener (HTTPS_PROXY/HTTP_PROXY).",
)
@store_option
@click.option("--principal", metavar="NAME", help="The agent this sidecar speaks for.")
@click.option("--admin", metavar="HOST:PORT", help="Admin listener (/healthz, /readyz, /metrics).")
@click.option(
    "--confdir",
    default="~/.mitmproxy",
    show_default=True,
    metavar="DIR",
    help="Where the CA lives; clients trust DIR/mitmproxy-ca-cert.pem.",
)
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@click.option(
    "--sweep-interval",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="How often ambiguous effects are reconciled (0: never).",
)
@click.option(
    "--check",
    is_flag=True,
    help="Validate policy, upstreams, ledger and listeners; exit 0 or 2 without serving.",
)
@errors
def proxy(
    policy_file: str | None,
    listen: str,
    store_url: str | None,
    principal: str | None,
    admin: str | None,
    confdir: str,
    log_format: str,
    sweep_interval: float,
    check: bool,
) -> None:
    """Run the sidecar proxy beside an agent.

    \b
    Examples:
      ctrlrun proxy --policy ctrlrun.yaml --principal refund-agent
      HTTPS_PROXY=http://127.0.0.1:8080 python agent.py   # trust ~/.mitmproxy/mitmproxy-ca-cert.pem
      ctrlrun proxy --policy ctrlrun.yaml --check
    SIGHUP reloads the policy; SIGTERM finishes in-flight protected requests, then stops.
    """
    from .logsetup import configure

    try:
        from ctrlrun.proxy import server
    except ImportError as exc:
        raise MissingDependency("mitmproxy", "proxy") from exc
    settings = server.ProxySettings(
        policy=policy_file,
        listen=server.parse_address(listen, "--listen"),
        store_url=store_url,
        principal=principal,
        admin=server.parse_address(admin, "--admin") if admin else None,
        confdir=confdir,
        sweep_interval=sweep_interval,
    )
    if check:
        click.echo(server.check(settings))
        return
    configure(log_format)
    sys.exit(server.serve(settings))


@main.command()
@click.argument("effect_key", required=False)
@click.option(
    "--policy",
    "policy_file",
    metavar="FILE",
    help="Policy file with the upstreams (default: $CTRLRUN_CONFIG or ./ctrlrun.yaml).",
)
@store_option
@errors
def reconcile(effect_key: str | None, policy_file: str | None, store_url: str | None) -> None:
    """Ask the remote now what happened to one ambiguous effect, or to all of them.

    \b
    Examples:
      ctrlrun reconcile refund:pi_123
      ctrlrun reconcile               # every ambiguous effect with a reconciler
    """
    from ctrlrun.proxy import registry
    from ctrlrun.proxy.config_parse import load_policy, proxy_config
    from ctrlrun.reconcilers.sweep import sweep

    from .control import Control

    policy = load_policy(policy_file)
    store = reader(store_url, policy_file)
    results = sweep(
        Control(policy, store),
        registry.build(proxy_config(policy).upstreams),
        keys=[effect_key] if effect_key else None,
        ask_now=True,
    )
    if not results:
        click.echo(
            f"{effect_key}: nothing to reconcile"
            if effect_key
            else "no ambiguous effects to reconcile"
        )
        if effect_key:
            sys.exit(1)
        return
    for key, answer in results:
        click.echo(f"{key}  {answer}")


@main.group()
def policy() -> None:
    """Work with policy files."""


@policy.command("check")
@click.argument("file", type=click.Path(dir_okay=False), default="ctrlrun.yaml")
@errors
def policy_check(file: str) -> None:
    """Validate a policy file; list actions with no effect: template (no deduplication).

    Example: ctrlrun policy check ctrlrun.yaml
    """
    from ctrlrun.proxy.config_parse import load_policy, proxy_config

    loaded = load_policy(file)
    click.echo(
        f"{file}: ok ({loaded.schema}, {len(loaded.actions)} actions, "
        f"{len(proxy_config(loaded).upstreams)} upstreams, mode {loaded.mode})"
    )
    for name in loaded.actions_without_effect():
        click.echo(f"warning: {name} has no effect: template; its writes cannot be deduplicated")
