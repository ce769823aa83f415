"""The sidecar's mitmproxy master: exactly the addons it needs, and the options it relies on.

A mitmproxy upgrade that renames or moves one of them, or adds a default addon, fails here
with a line that says what moved and where to decide (proxy/master.py).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from pathlib import Path
from typing import Any

import pytest
from mitmproxy import addons, connection, options
from mitmproxy import log as mitmlog
from mitmproxy.proxy import server_hooks
from mitmproxy.tools.dump import DumpMaster

from ctrlrun.errors import CTRLRunError
from ctrlrun.proxy import master as lean
from ctrlrun.proxy.addon import CtrlrunAddon
from ctrlrun.proxy.config import Upstream
from ctrlrun.proxy.recognize import Recognizer
from ctrlrun.proxy.tunnels import GuardedNextLayer

UP = Upstream("stripe", "stripe", "http://127.0.0.1:9", "http", "127.0.0.1", 9)
MODES = ["regular@127.0.0.1:0", "reverse:http://127.0.0.1:9@127.0.0.1:1"]  # never bound here
# Exactly the chain, in this order.
CHAIN = [
    "core",
    "block",
    "disableh2c",
    "proxyserver",
    "dnsresolver",
    "nextlayer",
    "tlsconfig",
    "updatealtsvc",
    "errorcheck",
]
# mitmproxy's default addons (DumpMaster's) that the sidecar leaves out: nothing it does
# needs them, and each would cost every flow's every hook. A new one is a decision to make.
LEFT_OUT = {
    "anticache",
    "anticomp",
    "blocklist",
    "browser",
    "clientplayback",
    "commandhistory",
    "comment",
    "cut",
    "export",
    "keepserving",
    "maplocal",
    "mapremote",
    "modifybody",
    "modifyheaders",
    "onboarding",
    "proxyauth",
    "readfilestdin",
    "save",
    "savehar",
    "scriptloader",
    "serverplayback",
    "stickyauth",
    "stickycookie",
    "stripdnshttpsrecords",
    "upstreamauth",
}


def names(chain: list[Any]) -> list[str]:
    return [getattr(a, "name", type(a).__name__.lower()) for a in chain]


def build(tmp_path: Path, trusted_ca: Path | None = None, then: Any = None) -> Any:
    """The lean master, built in a loop of its own; ``then(master)`` runs in that loop too.
    mitmproxy's log handlers are taken down again, so later tests' logs do not reach them."""

    async def make() -> Any:
        recognizer = Recognizer([UP], environ={})
        master = lean.build(tmp_path, MODES, recognizer, lambda: False, trusted_ca)
        try:
            if then is not None:
                await then(master)
        finally:
            await shut(master)
        return master

    return asyncio.run(make())


async def shut(master: Any) -> None:
    if (check := master.addons.get("errorcheck")) is not None:
        check.finish()
    await master.done()


def test_the_master_has_exactly_the_sidecars_addons_in_mitmproxys_order(tmp_path: Path) -> None:
    master = build(tmp_path)
    assert names(master.addons.chain) == CHAIN
    assert isinstance(master.addons.get("nextlayer"), GuardedNextLayer)
    assert list(lean.ADDONS) == CHAIN


def test_no_log_record_becomes_an_add_log_event_nobody_hooks(tmp_path: Path) -> None:
    seen: list[list[Any]] = []

    async def handlers(master: Any) -> None:
        seen.append(list(logging.getLogger().handlers))

    master = build(tmp_path, then=handlers)
    assert not any(isinstance(h, mitmlog.LegacyLogEvents) for h in seen[0])
    assert master.addons.callables("add_log") == ()
    assert not hasattr(CtrlrunAddon, "add_log")  # added to the chain by the server


def test_mitmproxys_default_addons_are_the_ones_this_sidecar_was_built_against() -> None:
    async def defaults() -> list[str]:
        dump = DumpMaster(options.Options(), with_termlog=False, with_dumper=False)
        await shut(dump)
        return names(dump.addons.chain)

    dump = asyncio.run(defaults())
    kept = set(CHAIN)
    gone = sorted(kept - set(dump))
    assert not gone, f"mitmproxy no longer loads {gone} by default: renamed or moved? see master.py"
    new = sorted(set(dump) - kept - LEFT_OUT)
    assert not new, f"mitmproxy has new default addons {new}: does the sidecar need them?"
    dropped = sorted(LEFT_OUT - set(dump))
    assert not dropped, f"mitmproxy dropped {dropped}: update LEFT_OUT"
    # Each addon the sidecar loads is the class mitmproxy's defaults use.
    default_types = {type(a) for a in addons.default_addons()}
    for name, cls in lean.addon_classes().items():
        if name != "errorcheck":  # DumpMaster's own, not in default_addons()
            assert cls in default_types, f"{cls} is not one of mitmproxy's defaults any more"


def test_the_options_the_sidecar_sets_exist_and_are_set(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle.pem"
    master = build(tmp_path, bundle)
    opts = master.options
    assert opts.mode == MODES
    assert opts.connection_strategy == "lazy"
    assert opts.confdir == str(tmp_path)
    assert opts.ssl_verify_upstream_trusted_ca == str(bundle)
    assert (opts.block_global, opts.block_private, opts.ssl_insecure) == (True, False, False)
    lean.check_options(opts)


def test_a_missing_option_is_named(tmp_path: Path) -> None:
    # mitmproxy's bare options lack those its addons add: as if one had moved.
    with pytest.raises(CTRLRunError, match="no option 'connection_strategy'"):
        lean.check_options(options.Options())
    master = build(tmp_path)
    master.options.update(block_global=False)
    with pytest.raises(CTRLRunError, match="'block_global' defaults to False"):
        lean.check_options(master.options)


def test_a_moved_addon_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lean, "ADDONS", {**lean.ADDONS, "block": ("blocking", "Block")})
    with pytest.raises(CTRLRunError, match=r"no mitmproxy\.addons\.blocking\.Block"):
        lean.addon_classes()
    monkeypatch.setattr(lean, "ADDONS", {**lean.ADDONS, "block": ("block", "Blocker")})
    with pytest.raises(CTRLRunError, match=r"addon 'block' moved"):
        lean.addon_classes()


@pytest.mark.parametrize(
    ("peer", "killed"),
    [
        ("127.0.0.1", False),
        ("::1", False),
        ("10.1.2.3", False),  # a pod's address: the agent beside the sidecar
        ("192.168.0.7", False),
        ("8.8.8.8", True),
        ("2001:4860:4860::8888", True),
        ("::ffff:8.8.8.8", True),
    ],
)
def test_a_connection_from_a_public_address_is_killed(
    tmp_path: Path, peer: str, killed: bool
) -> None:
    """block_global on the master's own chain: a sidecar on 0.0.0.0 is no open proxy."""
    client = connection.Client(
        peername=(peer, 50000), sockname=("0.0.0.0", 8080), timestamp_start=0
    )
    assert ipaddress.ip_address(peer.removeprefix("::ffff:")).is_global is killed

    async def connect(master: Any) -> None:
        await master.addons.handle_lifecycle(server_hooks.ClientConnectedHook(client))

    build(tmp_path, then=connect)
    assert (client.error is not None) is killed


def test_messages_are_built_without_mitmproxys_debug_typechecks(tmp_path: Path) -> None:
    from mitmproxy import http

    build(tmp_path)
    # What ``python -O`` does: no walk of the annotations per message. A mitmproxy that
    # dropped or renamed the hook leaves nothing to skip, and this says so.
    assert http.MessageData.__post_init__ is lean._no_typecheck  # type: ignore[attr-defined]
    request = http.Request.make("POST", "http://127.0.0.1:9/v1/refunds", b"amount=5")
    assert (request.method, request.content) == ("POST", b"amount=5")
    response = http.Response.make(402, b"{}", {"content-type": "application/json"})
    assert response.status_code == 402
