"""The operator console: ``console``."""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING

import click

from .common import errors, store_option

if TYPE_CHECKING:
    from ctrlrun.console import ConsoleServer


@click.command()
@click.option(
    "--listen",
    default="127.0.0.1:9091",
    show_default=True,
    metavar="HOST:PORT",
    help="Where to serve the console (loopback unless --allow-remote).",
)
@store_option
@click.option(
    "--policy",
    "policy_file",
    metavar="FILE",
    help="Policy with the `operators:` section (default: $CTRLRUN_CONFIG or ./ctrlrun.yaml).",
)
@click.option(
    "--allow-remote",
    is_flag=True,
    help="Listen on a non-loopback address (put it behind TLS: tokens and cookies cross it).",
)
@click.option(
    "--tls-cert",
    metavar="FILE",
    help="Serve HTTPS with this PEM certificate (chain); the session cookie is then Secure.",
)
@click.option(
    "--tls-key", metavar="FILE", help="The certificate's private key (default: in --tls-cert)."
)
@click.option(
    "--public-url",
    metavar="URL",
    help="The address operators open when a TLS proxy is in front (https://console.example."
    "com): forms from it are accepted, and the cookie is then Secure.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    metavar="N",
    help="Connections served at once (a thread each); past them a new one is answered 503.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Log lines on stderr: plain text or one JSON object per line.",
)
@errors
def console(
    listen: str,
    store_url: str | None,
    policy_file: str | None,
    allow_remote: bool,
    tls_cert: str | None,
    tls_key: str | None,
    public_url: str | None,
    max_connections: int,
    log_format: str,
) -> None:
    """Serve the operator console: a web page over the ledger for the people who answer for
    agents.

    \b
    It shows, after a login:
      Approvals          pending requests: action, arguments, agent, expiry; approve or deny
      Ambiguous effects  what to check at the remote; settle committed or failed, with a note
      Receipts           the newest receipts, and whether the hash chain is intact
      Freeze             the kill switch: freeze every action or one, with a reason; unfreeze

    Operators log in with their token: the value of the environment variable that their
    entry in the policy's `operators:` section names (read once, at start). Every approval,
    settlement and freeze is recorded under the operator's name, as `--as NAME` would be.
    Sessions live in this process (restart it and everyone logs in again); every form
    carries a CSRF token. Each login's pages, and its cookie, are under a secret path of
    their own (/s/...), since browsers send a cookie to every port of its host; /approvals,
    /ambiguous, /receipts and /freeze lead to the login, then to that page. It listens on
    loopback; elsewhere only with --allow-remote, and then over TLS: --tls-cert, or a TLS
    proxy in front and --public-url naming the address operators open through it (the
    browser's Origin, and the Host if the proxy passes it on).
    It serves at most --max-connections connections at once: past them a new one is answered
    503 (over TLS, closed), so a flood of connections cannot make it start a thread for each.

    \b
    Example:
      # ctrlrun.yaml:  operators: {alice: {token_env: CTRLRUN_OPERATOR_ALICE}}
      export CTRLRUN_OPERATOR_ALICE=$(openssl rand -hex 24)
      ctrlrun console --policy ctrlrun.yaml --listen 127.0.0.1:9091
      # then open http://127.0.0.1:9091 and log in as alice with that token
      # behind a TLS proxy that forwards https://console.example.com to 127.0.0.1:9091:
      ctrlrun console --policy ctrlrun.yaml --public-url https://console.example.com
    """
    from ctrlrun import logsetup
    from ctrlrun.console import ConsoleSettings, build

    logsetup.configure(log_format)

    settings = ConsoleSettings(
        listen=listen,
        store_url=store_url,
        policy=policy_file,
        allow_remote=allow_remote,
        tls_cert=tls_cert,
        tls_key=tls_key,
        public_url=public_url,
        max_connections=max_connections,
    )
    _serve(build(settings))


def _serve(server: ConsoleServer) -> None:
    names = ", ".join(sorted(server.app.tokens))
    click.echo(
        f"ctrlrun console: listening on {server.url} (operators: {names}; "
        f"ledger {server.app.store.location})"
    )
    sys.stdout.flush()

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.app.store.close()
