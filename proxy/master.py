"""The sidecar's mitmproxy master: only the addons a sidecar uses.

mitmproxy's ``DumpMaster`` loads about thirty default addons (replay, scripts, header and
body rewriting, HAR export, the ``mitm.it`` onboarding site, a command history written to the
confdir, ...). Every hook event of every flow walks all of them, about 600 µs of CPU per
request, and none of them is wanted here. This master has only:

========================  ==================================================================
``core``                  the core options' checks
``block``                 ``block_global``: a sidecar listening on 0.0.0.0 kills connections
                          from public addresses, so it is never an open proxy
``disable_h2c``           strips h2c upgrades, kills HTTP/2 prior-knowledge requests
``proxyserver``           the listeners (explicit, reverse, transparent) and connections
``dns_resolver``          its options (the sidecar serves no DNS mode)
``nextlayer``             ctrlrun's rule (:class:`~ctrlrun.proxy.tunnels.GuardedNextLayer`)
``tlsconfig``             TLS interception with the CA in the confdir, upstream verification
``update_alt_svc``        a reverse listener's ``Alt-Svc`` keeps clients on the listener
``errorcheck``            an error logged while starting (a port in use) ends the process
========================  ==================================================================

in mitmproxy's own order, on an addon manager that sends each event only to the addons with
its hook (``dispatch``). ``SETS`` and ``DEFAULTS`` are the options the sidecar sets or relies
on; a mitmproxy that renamed or moved one of them (or an addon) fails here, at start-up, with
a line that says which.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctrlrun.errors import CTRLRunError

from .recognize import Recognizer

if TYPE_CHECKING:
    from mitmproxy.master import Master

# Addon name as mitmproxy's chain knows it -> (module in mitmproxy.addons, class).
ADDONS: Mapping[str, tuple[str, str]] = {
    "core": ("core", "Core"),
    "block": ("block", "Block"),
    "disableh2c": ("disable_h2c", "DisableH2C"),
    "proxyserver": ("proxyserver", "Proxyserver"),
    "dnsresolver": ("dns_resolver", "DnsResolver"),
    "nextlayer": ("next_layer", "NextLayer"),  # ctrlrun's subclass takes its place
    "tlsconfig": ("tlsconfig", "TlsConfig"),
    "updatealtsvc": ("update_alt_svc", "UpdateAltSvc"),
    "errorcheck": ("errorcheck", "ErrorCheck"),
}
# Options the sidecar sets.
SETS = ("confdir", "mode", "connection_strategy", "ssl_verify_upstream_trusted_ca")
# Options whose default the sidecar relies on, and that default.
DEFAULTS: Mapping[str, object] = {
    "block_global": True,  # never an open proxy on 0.0.0.0
    "block_private": False,  # a pod's agent connects from a private address
    "ssl_insecure": False,  # upstream certificates are verified
}


class TrailersLine(logging.Filter):
    """mitmproxy does not read HTTP/1 trailers: a chunked request that ends with one crashes
    its connection (``NotImplementedError``) and is dropped unread, nothing forwarded; nor
    does it write them to an HTTP/1 server (``AssertionError``). Each is logged as one line,
    not as mitmproxy's crash and traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, NotImplementedError) and "trailers" in str(exc).lower():
            line = TRAILERS
        elif isinstance(exc, AssertionError) and "RequestTrailers" in str(exc):
            line = RELAYED_TRAILERS  # an upstream's request with trailers is refused first
        else:
            return True
        record.msg, record.args, record.exc_info = line, (), None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


TRAILERS = (
    "a request whose chunked body ends with trailers was dropped unread (mitmproxy reads "
    "no trailers): nothing was forwarded; send the request without trailers"
)
RELAYED_TRAILERS = (
    "an HTTP/2 request with trailers to an HTTP/1 server that is no upstream was cut after "
    "its body (mitmproxy relays no trailers over HTTP/1); send the request without trailers"
)


def addon_classes() -> dict[str, type]:
    """The addon classes, by chain name; raises CTRLRunError (one line) naming what moved."""
    found: dict[str, type] = {}
    for name, (module, cls) in ADDONS.items():
        where = f"mitmproxy.addons.{module}.{cls}"
        try:
            found[name] = getattr(importlib.import_module(f"mitmproxy.addons.{module}"), cls)
        except (ImportError, AttributeError):
            raise CTRLRunError(f"{_version()}: no {where} (addon {name!r} moved?)") from None
    return found


def build(
    confdir: Path,
    modes: list[str],
    recognizer: Recognizer,
    inspect_transparent: Callable[[], bool],
    trusted_ca: Path | None,
) -> Master:
    """The lean master (inside the running loop, as mitmproxy needs)."""
    from mitmproxy import options

    from .dispatch import IndexedMaster
    from .tunnels import GuardedNextLayer

    classes = addon_classes()
    skip_message_typechecks()
    server_log = logging.getLogger("mitmproxy.proxy.server")
    if not any(isinstance(f, TrailersLine) for f in server_log.filters):
        server_log.addFilter(TrailersLine())
    opts: Any = options.Options(confdir=str(confdir))  # mitmproxy's options are untyped
    master = IndexedMaster(opts)  # each event only to the addons with its hook
    chain: list[Any] = []
    for name, cls in classes.items():
        if name == "nextlayer":
            chain.append(GuardedNextLayer(recognizer, inspect_transparent))
        else:
            chain.append(cls())
    manager: Any = master.addons
    manager.add(*chain)
    check_options(opts)
    # Addon options exist only once their addons are loaded.
    opts.update(mode=modes, connection_strategy="lazy")
    if trusted_ca is not None:
        opts.update(ssl_verify_upstream_trusted_ca=str(trusted_ca))
    return master


def skip_message_typechecks() -> None:
    """Skip the field type checks mitmproxy runs on every request and response it builds.

    ``MessageData.__post_init__`` checks each field's type against its annotation, walking
    ``typing`` on every message (about 5% of the sidecar's CPU per protected write); mitmproxy
    defines it only ``if __debug__``, so under ``python -O`` it does not exist. The parsers fill
    those fields with the types they declare; only an addon that built a message from wrong
    types would be caught, and the sidecar's own messages are built by ``Response.make`` from
    bytes and ints. Asserts elsewhere (mitmproxy's state machines, ctrlrun's own) stay.
    """
    from mitmproxy.http import MessageData

    if "__post_init__" in vars(MessageData):
        setattr(MessageData, "__post_init__", _no_typecheck)  # noqa: B010 (a class attribute mypy does not see)


def _no_typecheck(self: object) -> None:
    return None


def check_options(opts: Any) -> None:
    """Every option the sidecar sets exists; those it leaves alone have the default it needs."""
    for name in (*SETS, *DEFAULTS):
        if name not in opts:
            raise CTRLRunError(f"{_version()}: no option {name!r} (renamed or moved?)")
    for name, value in DEFAULTS.items():
        if getattr(opts, name) != value:
            got = getattr(opts, name)
            raise CTRLRunError(
                f"{_version()}: option {name!r} defaults to {got!r}, the sidecar needs {value!r}"
            )


def _version() -> str:
    from mitmproxy import version

    return f"mitmproxy {version.VERSION}"
