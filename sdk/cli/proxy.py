"""The sidecar's commands: ``proxy`` and ``demo``.

They import the proxy when run, so the other commands work without the ``proxy`` extra.
"""

from __future__ import annotations

import sys

import click

from ctrlrun.errors import MissingDependency

from .common import errors, store_option


def _principal(value: str | None) -> str | None:
    # Empty, it would be no principal at all: a sidecar that refuses every protected write.
    if value is not None and not value.strip():
        raise click.BadParameter("empty: name the agent this sidecar speaks for, e.g. refund-agent")
    return value


@click.command()
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


@click.command()
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
@click.option(
    "--mode",
    type=click.Choice(["regular", "transparent"]),
    default="regular",
    show_default=True,
    help="regular: agents set HTTPS_PROXY. transparent: --listen receives connections "
    "redirected by netfilter (deploy/ctrlrun-egress.sh), for agents that ignore proxies.",
)
@store_option
@click.option(
    "--principal",
    metavar="NAME",
    callback=lambda _ctx, _param, value: _principal(value),
    help="The agent this sidecar speaks for.",
)
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
@click.option(
    "--create-ledger",
    is_flag=True,
    help="Start a new, empty SQLite ledger where the one created before is missing or 0 bytes "
    "(without it that is refused: its effects would be forgotten). An existing one is kept.",
)
@errors
def proxy(
    policy_file: str | None,
    listen: str,
    mode: str,
    store_url: str | None,
    principal: str | None,
    admin: str | None,
    confdir: str,
    log_format: str,
    sweep_interval: float,
    check: bool,
    create_ledger: bool,
) -> None:
    """Run the sidecar proxy beside an agent.

    \b
    Examples:
      ctrlrun proxy --policy ctrlrun.yaml --principal refund-agent
      HTTPS_PROXY=http://127.0.0.1:8080 python agent.py   # trust ~/.mitmproxy/mitmproxy-ca-cert.pem
      ctrlrun proxy --policy ctrlrun.yaml --check
      ctrlrun proxy --policy ctrlrun.yaml --principal refund-agent --mode transparent
    SIGHUP reloads the policy; SIGTERM finishes in-flight protected requests, then stops.
    """
    from ctrlrun.logsetup import configure

    try:
        from ctrlrun.proxy import server
    except ImportError as exc:
        raise MissingDependency("mitmproxy", "proxy") from exc
    settings = server.ProxySettings(
        policy=policy_file,
        listen=server.parse_address(listen, "--listen"),
        mode=mode,
        store_url=store_url,
        principal=principal,
        admin=server.parse_address(admin, "--admin") if admin else None,
        confdir=confdir,
        sweep_interval=sweep_interval,
        create_ledger=create_ledger,
    )
    if check:
        click.echo(server.check(settings))
        return
    configure(log_format)
    sys.exit(server.serve(settings))
