"""mitmproxy's addon manager, with each event sent only to the addons that have its hook.

mitmproxy's ``AddonManager.trigger_event`` walks the whole chain for every event: for each
addon a context manager, a coroutine, two generators and a ``getattr``, whether or not the
addon has the hook; and ``handle_lifecycle`` follows every flow event with an ``update``
event that no addon of the sidecar has. A read makes eight such walks; they cost more than
a fifth of the proxy's CPU for it.

:class:`IndexedAddons` looks the hooks up once per event name (again whenever the chain
changes) and calls exactly what mitmproxy would, in the same order, with the same rules: each
top-level addon's hooks (its own, then its sub-addons') run inside ``safecall`` (an error is
logged, the next addon still runs), ``AddonHalt`` ends the event, an awaitable result is
awaited, a module of the hook's name is no hook. It assumes, as every addon here does, that
an addon's hook methods do not come and go after it was added.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Sequence
from typing import Any

from mitmproxy import exceptions, flow, hooks
from mitmproxy.addonmanager import AddonManager, safecall, traverse
from mitmproxy.master import Master

Hooks = tuple[tuple[Callable[..., Any], ...], ...]  # per top-level addon: its callables


class IndexedAddons(AddonManager):
    """``AddonManager`` with an index of who has which hook."""

    def __init__(self, master: Master) -> None:
        super().__init__(master)  # type: ignore[no-untyped-call]
        self._index: dict[str, Hooks] = {}
        self._indexed: tuple[list[Any], int] | None = None  # the chain (object, length) indexed

    def callables(self, name: str) -> Hooks:
        """The callables of hook ``name``, grouped by top-level addon, in chain order."""
        chain = self.chain
        if self._indexed is None or self._indexed[0] is not chain or self._indexed[1] != len(chain):
            self._index, self._indexed = {}, (chain, len(chain))  # add/remove/clear moved it
        found = self._index.get(name)
        if found is None:
            found = self._index[name] = _find(chain, name)
        return found

    async def trigger_event(self, event: hooks.Hook) -> None:
        groups = self.callables(event.name)
        if not groups:
            return
        args = event.args()
        for funcs in groups:
            try:
                with safecall():
                    for func in funcs:
                        res = func(*args)
                        if res is not None and inspect.isawaitable(res):
                            await res
            except exceptions.AddonHalt:
                return

    async def handle_lifecycle(self, event: hooks.Hook) -> None:
        await self.trigger_event(event)
        if self.callables(hooks.UpdateHook.name):  # no sidecar addon has one: nothing to build
            message = event.args()[0]
            if isinstance(message, flow.Flow):
                await self.trigger_event(hooks.UpdateHook([message]))


def _find(chain: Sequence[Any], name: str) -> Hooks:
    groups = []
    for top in chain:
        funcs = []
        for addon in traverse([top]):  # type: ignore[no-untyped-call]
            func = getattr(addon, name, None)
            if not func or isinstance(func, types.ModuleType):
                continue
            funcs.append(func if callable(func) else _not_callable(name, addon))
        if funcs:
            groups.append(tuple(funcs))
    return tuple(groups)


def _not_callable(name: str, addon: Any) -> Callable[..., None]:
    def fail(*_: Any) -> None:  # raised inside safecall, and so logged, as mitmproxy does
        error: Any = exceptions.AddonManagerError  # untyped
        raise error(f"Addon handler {name} ({addon}) not callable")

    return fail


class IndexedMaster(Master):
    """mitmproxy's ``Master`` whose addon manager is :class:`IndexedAddons`."""

    def __init__(self, opts: Any) -> None:
        super().__init__(opts, with_termlog=False)
        # No addon of the sidecar has the deprecated ``add_log`` hook, and the handler that
        # feeds it would format every log record a second time and wake the loop through its
        # self-pipe to deliver it (17 µs of a write's log line). mitmproxy's own shutdown
        # removes it again, which is then a no-op.
        legacy = getattr(self, "_legacy_log_events", None)
        if legacy is not None:
            legacy.uninstall()
        opts.changed.disconnect(self.addons._configure_all)  # the empty manager it made
        self.addons = IndexedAddons(self)
