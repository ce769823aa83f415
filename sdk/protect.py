"""``@protect``: the SDK entrance to the kernel, for ``def`` and ``async def`` functions."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar, cast

from .action import Action
from .attempt import Attempt, describe
from .context import attempt_token, current_principal, presented_approval, with_approval
from .control import Control
from .defaults import process_control
from .errors import ActionDenied, ApprovalRequired, EffectKeyError, InvalidArgument, NotExecuted
from .reconcile import ReconcileHook
from .templates import Template, TemplateSyntaxError, parse_template

log = logging.getLogger("ctrlrun")
F = TypeVar("F", bound=Callable[..., Any])


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
    second call resolving to a committed key raises ``DuplicateEffect``. ``reconcile`` is asked
    what happened when an outcome is unknown (``reconcile_eagerly=True``: right away).
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
        signature = inspect.signature(fn)
        for param in signature.parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise InvalidArgument(
                    f"{fn.__qualname__}: *args/**kwargs are not allowed; every argument must be "
                    "nameable in policy"
                )
        warned: list[bool] = []

        def prepare(
            args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> tuple[Control, Action, str | None]:
            principal = current_principal()
            if principal is None:
                log.warning("%s refused: no principal (use ctrlrun.context(agent=...))", name)
                raise ActionDenied(
                    "no_principal",
                    f"{name} denied: no principal; call it inside ctrlrun.context(agent=...)",
                )
            ctl = control or process_control()
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            res = resource_tpl.resolve(arguments) if resource_tpl else None
            action = Action(name, arguments, principal, res, ctl.environment)
            policy_tpl = ctl.policy.effect_template(name)
            tpl = effect_tpl or policy_tpl
            if effect_tpl and policy_tpl and effect_tpl.text != policy_tpl.text and not warned:
                warned.append(True)
                log.warning(
                    "%s: decorator effect %r overrides policy effect %r",
                    name,
                    effect_tpl.text,
                    policy_tpl.text,
                )
            key = None
            if tpl is not None:
                try:
                    key = tpl.resolve(action.arguments, resource=action.resource)
                except EffectKeyError as exc:
                    ctl.refuse_effect_key(action, exc)
                    raise
            if reconcile is not None and key is None and not warned:
                warned.append(True)
                log.warning("%s: reconcile hook given but the action has no effect key", name)
            return ctl, action, key

        def call_args(action: Action) -> tuple[list[Any], dict[str, Any]]:
            values = action.canonical_arguments
            positional, keyword = [], {}
            for pname, param in signature.parameters.items():
                if param.kind is param.POSITIONAL_ONLY:
                    positional.append(values[pname])
                else:
                    keyword[pname] = values[pname]
            return positional, keyword

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                ctl, action, key = prepare(args, kwargs)
                attempt = await _begin_async(ctl, action, key, lease, reconcile, wait)
                pos, kw = call_args(action)
                try:
                    with attempt_token(attempt.held_key):
                        value = await fn(*pos, **kw)
                except NotExecuted as exc:
                    await _shielded(ctl.finish, attempt, "failed", describe(exc))
                    raise
                except BaseException as exc:
                    await _shielded(ctl.finish, attempt, "ambiguous", describe(exc))
                    if isinstance(exc, Exception):
                        await asyncio.to_thread(
                            ctl.eager_reconcile, attempt, reconcile, reconcile_eagerly
                        )
                    raise
                await _shielded(ctl.finish, attempt, "committed", None)
                return value

            return cast(F, async_wrapper)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctl, action, key = prepare(args, kwargs)
            attempt = _begin(ctl, action, key, lease, reconcile, wait)
            pos, kw = call_args(action)
            value, _ = ctl.run(
                attempt,
                lambda: fn(*pos, **kw),
                reconcile=reconcile,
                reconcile_eagerly=reconcile_eagerly,
            )
            return value

        return cast(F, wrapper)

    return decorate


def _begin(
    ctl: Control,
    action: Action,
    key: str | None,
    lease: timedelta | None,
    reconcile: ReconcileHook | None,
    wait: bool,
) -> Attempt:
    try:
        return ctl.begin(
            action, key, approval_id=presented_approval(), lease=lease, reconcile=reconcile
        )
    except ApprovalRequired as exc:
        if not wait:
            raise
        ctl.wait_for_approval(exc.request_id)
        with with_approval(exc.request_id):
            return ctl.begin(
                action, key, approval_id=exc.request_id, lease=lease, reconcile=reconcile
            )


async def _begin_async(
    ctl: Control,
    action: Action,
    key: str | None,
    lease: timedelta | None,
    reconcile: ReconcileHook | None,
    wait: bool,
) -> Attempt:
    return await asyncio.to_thread(_begin, ctl, action, key, lease, reconcile, wait)


async def _shielded(
    finish: Callable[..., Any], attempt: Attempt, outcome: str, error: str | None
) -> None:
    # The outcome must be recorded even if the caller's task is cancelled while we write it.
    await asyncio.shield(asyncio.to_thread(finish, attempt, outcome, error=error))


def _template(text: str | None, what: str) -> Template | None:
    if text is None:
        return None
    try:
        return parse_template(text)
    except TemplateSyntaxError as exc:
        raise InvalidArgument(f"{what} template: {exc}") from None
