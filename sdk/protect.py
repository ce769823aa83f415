"""``@protect``: the SDK entrance to the kernel, for ``def`` and ``async def`` functions.

The decorator is a thin shell over a per-call handler, ``_Call``: it prepares the action and
its effect key, admits the attempt (``Control.begin``), and settles what the function did
(``Control.settle``). The sync wrapper runs it through ``Control.run``; the async wrapper runs
the same handler's steps in worker threads around ``await fn(...)``, so there is one way a
call is decided and recorded, whichever kind of function it is.

Cancellation is honest: a cancelled async call waits until the ledger write it started has
ended (that thread cannot be stopped), and a reservation taken for a function that will never
start is released as not executed (``failed``), never left ``executing`` for its lease.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import io
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar, cast

from . import tracing
from .action import Action
from .attempt import Attempt, unrecorded
from .context import attempt_token, current_principal, presented_approval
from .control import Control
from .defaults import process_control
from .errors import ActionDenied, ApprovalRequired, EffectKeyError, InvalidArgument
from .reconcile import ReconcileHook
from .templates import Template, TemplateSyntaxError, parse_template

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def protect(
    name: str,
    *,
    effect: str | None = None,
    resource: str | None = None,
    reconcile: ReconcileHook | None = None,
    reconcile_eagerly: bool = False,
    lease: timedelta | None = None,
    wait: bool = False,
    control: Control | None = None,
) -> Callable[[F], F]:
    """Run the decorated function only as the policy allows, at most once per effect key.

    ``effect`` is a template over the function's arguments (``"refund:{payment_id}"``); a
    second call resolving to a committed key raises ``DuplicateEffect``. ``resource`` names
    what the action touches (the policy's ``resource:`` when not given). ``reconcile`` is
    asked what happened when an outcome is unknown (``reconcile_eagerly=True``: right away).
    Works on ``def`` and ``async def`` functions; returns the function's value.
    """
    if not isinstance(name, str) or not name:
        raise InvalidArgument("protect needs a non-empty action name")
    effect_tpl = _template(effect, "effect")
    resource_tpl = _template(resource, "resource")
    if reconcile is not None and not callable(reconcile):
        raise InvalidArgument("reconcile must be callable")
    if lease is not None and (not isinstance(lease, timedelta) or lease <= timedelta(0)):
        raise InvalidArgument("lease must be a positive timedelta")

    def decorate(fn: F) -> F:
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise InvalidArgument(
                f"{fn.__qualname__} is a generator function: its body runs when it is iterated, "
                "after the call is recorded; protect a function that acts when called"
            )
        signature = inspect.signature(fn)
        for param in signature.parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise InvalidArgument(
                    f"{fn.__qualname__}: *args/**kwargs are not allowed; every argument must be "
                    "nameable in policy"
                )
        spec = _Spec(
            name, _Binder(signature), effect_tpl, resource_tpl, reconcile, reconcile_eagerly,
            lease, wait,
        )  # fmt: skip
        if inspect.iscoroutinefunction(fn):
            return cast(F, _async_wrapper(fn, spec, control))
        return cast(F, _sync_wrapper(fn, spec, control))

    return decorate


def _sync_wrapper(fn: Callable[..., Any], spec: _Spec, control: Control | None) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with tracing.protected(spec.name):  # a span, child of the caller's, if otel is set up
            call = _Call(spec, control, args, kwargs)
            attempt = call.begin()
            pos, kw = call.arguments()
            value, _ = call.ctl.run(
                attempt,
                lambda: _acted(fn(*pos, **kw), spec.name),
                reconcile=spec.reconcile,
                reconcile_eagerly=spec.reconcile_eagerly,
            )
            return value

    return wrapper


def _async_wrapper(fn: Callable[..., Any], spec: _Spec, control: Control | None) -> Any:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        with tracing.protected(spec.name):
            call = _Call(spec, control, args, kwargs, threading.Event())
            attempt = await _admit(call)
            pos, kw = call.arguments()
            try:
                with attempt_token(attempt.held_key), call.ctl.holding(attempt):
                    value = _acted(await fn(*pos, **kw), spec.name)
            except BaseException as exc:
                await _to_the_end(call.settle, attempt, exc)
                raise
            await _to_the_end(call.settle, attempt, None)
            return value

    return wrapper


@dataclass(frozen=True)
class _Spec:
    """One decorated function's protection, fixed at decoration time."""

    name: str
    binder: _Binder
    effect: Template | None
    resource: Template | None
    reconcile: ReconcileHook | None
    reconcile_eagerly: bool
    lease: timedelta | None
    wait: bool
    warned: set[str] = field(default_factory=set, compare=False)  # each warning once

    def warn_once(self, what: str, message: str, *args: Any) -> None:
        if what not in self.warned:
            self.warned.add(what)
            log.warning(message, *args)

    def effect_key(self, ctl: Control, action: Action) -> str | None:
        """The call's effect key (the decorator's template wins over the policy's)."""
        policy_tpl = ctl.policy.effect_template(self.name)
        if self.effect and policy_tpl and self.effect.text != policy_tpl.text:
            self.warn_once(
                "effect",
                "%s: decorator effect %r overrides policy effect %r",
                self.name,
                self.effect.text,
                policy_tpl.text,
            )
        template = self.effect or policy_tpl
        if template is None:
            if self.reconcile is not None:
                message = "%s: reconcile hook given but the action has no effect key"
                self.warn_once("reconcile", message, self.name)
            return None
        try:
            # plain: the function receives the value as given, and may read "01" as 1
            key = template.resolve(action.arguments, resource=action.resource, plain=True)
            via = self.resource or ctl.policy.resource_template(self.name)
            if "resource" in template.names and via is not None:  # its values are the key's
                via.resolve(action.arguments, plain=True)
            return key
        except EffectKeyError as exc:
            ctl.refuse_effect_key(action, exc)
            raise

    def check_resource(self, ctl: Control) -> None:
        policy_tpl = ctl.policy.resource_template(self.name)
        if self.resource and policy_tpl and self.resource.text != policy_tpl.text:
            self.warn_once(
                "resource",
                "%s: decorator resource %r overrides policy resource %r",
                self.name,
                self.resource.text,
                policy_tpl.text,
            )


class _Call:
    """One call of a protected function: prepared and admitted, then settled."""

    def __init__(
        self,
        spec: _Spec,
        control: Control | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        stop: threading.Event | None = None,
    ) -> None:
        self.spec, self.control, self.args, self.kwargs = spec, control, args, kwargs
        self.stop = stop  # an async call's: set when its caller is cancelled
        self.ctl: Control
        self.action: Action

    def begin(self) -> Attempt:
        """Build the action and its key, then admit it (waiting for a human if ``wait``)."""
        spec = self.spec
        principal = current_principal()
        if principal is None:
            log.warning("%s refused: no principal (use ctrlrun.context(agent=...))", spec.name)
            raise ActionDenied(
                "no_principal",
                f"{spec.name} denied: no principal; call it inside ctrlrun.context(agent=...)",
            )
        self.ctl = ctl = self.control or process_control()
        arguments = spec.binder.bind(self.args, self.kwargs)
        spec.check_resource(ctl)
        self.action = action = ctl.action(spec.name, arguments, principal, resource=spec.resource)
        key = spec.effect_key(ctl, action)
        lease, hook = spec.lease, spec.reconcile
        try:
            return ctl.begin(
                action, key, approval_id=presented_approval(), lease=lease, reconcile=hook
            )
        except ApprovalRequired as exc:
            if not spec.wait:
                raise
            ctl.wait_for_approval(exc.request_id, stop=self.stop)
            return ctl.begin(action, key, approval_id=exc.request_id, lease=lease, reconcile=hook)

    def arguments(self) -> tuple[list[Any], dict[str, Any]]:
        """What the function is called with: fresh canonical copies, never the caller's."""
        values = self.action.arguments
        if not all(type(v) in _IMMUTABLE for v in values.values()):
            values = self.action.canonical_arguments  # a str, int, bool or None is its own copy
        only = self.spec.binder.positional_only
        if not only:
            return [], dict(values)
        return [values[n] for n in only], {n: v for n, v in values.items() if n not in only}

    def settle(self, attempt: Attempt, error: BaseException | None) -> None:
        try:
            self.ctl.settle(
                attempt,
                error,
                reconcile=self.spec.reconcile,
                reconcile_eagerly=self.spec.reconcile_eagerly,
            )
        except Exception as failure:
            if error is None:  # it returned: a record that could not be written is never hidden
                raise
            unrecorded(attempt, error, failure)  # the function's own exception goes on


def _acted(value: T, name: str) -> T:
    """``value``, unless it is work still to be done (an awaitable, a generator, a thread
    pool's future, a lazy ``map``/``filter``, any iterator but a file): that would act after
    the call is recorded, outside its protection, and a record saying committed then refused
    every retry of an effect that had not happened (or never would). It is closed or
    cancelled unrun and refused, and the call, whose function may have acted before
    returning it, is recorded ambiguous."""
    if not (
        inspect.isawaitable(value)
        or inspect.isgenerator(value)
        or inspect.isasyncgen(value)
        or isinstance(value, _LATER)
        or (isinstance(value, Iterator) and not isinstance(value, io.IOBase))
    ):
        return value
    close = getattr(value, "cancel", None) or getattr(value, "close", None)
    if callable(close) and not inspect.isasyncgen(value):
        close()
    raise InvalidArgument(
        f"{name}: the protected function returned {type(value).__name__}, an awaitable, "
        "generator or other work that would act after the call is recorded; protect the async "
        "def itself (or await it, wait for its result or list it inside the function)"
    )


# Not awaitables, but work still to be done; so is any iterator but a file: itertools.starmap,
# accumulate, takewhile, and zip, enumerate, chain or islice over a lazy map call functions
# when iterated, and which do cannot be told from outside.
_LATER = (concurrent.futures.Future, map, filter)


async def _admit(call: _Call) -> Attempt:
    """``call.begin`` in a thread; if the caller is cancelled meanwhile, undo what it took."""
    job = asyncio.ensure_future(asyncio.to_thread(call.begin))
    cancelled = await _wait_out(job, call.stop)
    if cancelled is None:
        return job.result()
    if job.exception() is None:
        # The key was taken for a function that will now never start: say it did not run.
        attempt = job.result()
        release = asyncio.ensure_future(asyncio.to_thread(call.ctl.release, attempt, cancelled))
        await _wait_out(release)
        if release.exception() is not None:
            log.error(
                "%s: the key of a cancelled call could not be released (%s); it stays "
                "executing until its lease ends",
                call.spec.name,
                release.exception(),
            )
    raise cancelled


async def _to_the_end(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a thread, awaited to its end even through a cancellation (re-raised
    after it, unless ``fn`` itself failed: a record that could not be written is never hidden)."""
    job = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    cancelled = await _wait_out(job)
    if cancelled is not None and job.exception() is None:
        raise cancelled
    return job.result()


async def _wait_out(
    job: asyncio.Future[Any], stop: threading.Event | None = None
) -> asyncio.CancelledError | None:
    """Wait until ``job`` is done, whatever cancellations arrive; return the first of them."""
    cancelled: asyncio.CancelledError | None = None
    while not job.done():
        try:
            await asyncio.wait((job,))
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
            if stop is not None:
                stop.set()  # a thread waiting for a human stops at its next poll
    return cancelled


_IMMUTABLE = (str, int, bool, type(None))
_BY_POSITION = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_BY_NAME = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


class _Binder:
    """A function's parameters, read once at decoration: maps a call's arguments to their
    names as ``Signature.bind`` and ``apply_defaults`` do (in parameter order), without their
    cost. Anything it does not map plainly goes to ``Signature.bind``, so a call that does not
    fit the signature raises the same ``TypeError``."""

    def __init__(self, signature: inspect.Signature) -> None:
        params = list(signature.parameters.values())
        self.signature = signature
        self.names = tuple(p.name for p in params)
        self.by_position = tuple(p.name for p in params if p.kind in _BY_POSITION)
        self.by_name = frozenset(p.name for p in params if p.kind in _BY_NAME)
        self.defaults = tuple((p.name, p.default) for p in params if p.default is not p.empty)
        only = inspect.Parameter.POSITIONAL_ONLY
        self.positional_only = tuple(p.name for p in params if p.kind is only)

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        names = self.names
        if len(args) <= len(self.by_position):
            bound = dict(zip(self.by_position, args, strict=False))
            if not kwargs and len(bound) == len(names):
                return bound  # every argument by position: already in parameter order
            if all(k in self.by_name and k not in bound for k in kwargs):
                bound.update(kwargs)
                for name, default in self.defaults:
                    bound.setdefault(name, default)
                if len(bound) == len(names):
                    return {n: bound[n] for n in names}
        full = self.signature.bind(*args, **kwargs)  # raises the TypeError of a wrong call
        full.apply_defaults()
        return dict(full.arguments)


def _template(text: str | None, what: str) -> Template | None:
    if text is None:
        return None
    try:
        return parse_template(text)
    except TemplateSyntaxError as exc:
        raise InvalidArgument(f"{what} template: {exc}") from None
