"""SDK reconcile hooks: ``Callable[[effect_key], ReconcileOutcome]`` over the built-ins.

An SDK hook is given only the effect key, so each factory takes the effect template and reads
the arguments back out of the key (:func:`parse_effect_key`); what the key does not carry
comes from the factory's keyword arguments::

    @ctrlrun.protect("refund", effect="refund:{payment_id}",
                     reconcile=stripe_refunds(api_key=KEY, amount=500))
    def refund(payment_id: str, amount: int) -> None:
        stripe.Refund.create(payment_intent=payment_id, amount=amount,
                             idempotency_key=ctrlrun.idempotency_token())
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Collection, Iterator, Mapping
from datetime import timedelta
from typing import Any

from ctrlrun.action import utc_now
from ctrlrun.context import idempotency_token_for
from ctrlrun.errors import InvalidArgument
from ctrlrun.reconcile import ReconcileHook, ReconcileOutcome
from ctrlrun.templates import Template, TemplateSyntaxError, parse_template

from .http import DEFAULT_TIMEOUT
from .kubernetes import KubernetesReconciler
from .stripe import STRIPE_API, StripeReconciler

log = logging.getLogger("ctrlrun.reconcilers")

_PLACEHOLDER = re.compile(r"\{[^{}]*\}")
# The SDK hook does not know which attempt it is asked about; any of these attempts' tokens
# (``ctrlrun.idempotency_token()``) found in Stripe's events identifies the effect.
SDK_ATTEMPTS = 32


def parse_effect_key(
    template: Template, key: str, *, ints: Collection[str] = ()
) -> dict[str, str | int] | None:
    """The arguments that ``template`` resolved to ``key``; None when there is not exactly one.

    The template's literal parts split the key, so ``"scale:{cluster}:{deployment}"`` and
    ``"scale:eu:web:1"`` are ambiguous (which colon ends the cluster?): None. Values of the
    names in ``ints`` must be digits and become ints.
    """
    literals = _PLACEHOLDER.split(template.text)
    if not key.startswith(literals[0]):
        return None
    found = _splits(key, literals)
    if len(found) != 1:
        return None
    out: dict[str, str | int] = {}
    for name, value in zip(template.names, found[0], strict=True):
        if name in ints:
            if not (value.isascii() and value.isdigit()):
                return None
            out[name] = int(value)
        elif out.get(name, value) != value:  # a name used twice must repeat its value
            return None
        else:
            out[name] = value
    return out


def _splits(key: str, literals: list[str]) -> tuple[tuple[str, ...], ...]:
    """Up to two ways to cut ``key`` into non-empty values, each ended by its literal."""

    @functools.cache
    def cut(pos: int, i: int) -> tuple[tuple[str, ...], ...]:
        # the value of placeholder i starts at pos and is ended by literals[i + 1]
        literal, last = literals[i + 1], i + 2 == len(literals)
        if last:
            end = len(key) - len(literal)
            ok = key.endswith(literal) and end > pos
            return ((key[pos:end],),) if ok else ()
        out: list[tuple[str, ...]] = []
        ends = range(pos + 1, len(key)) if literal == "" else _occurrences(key, literal, pos + 1)
        for end in ends:
            out.extend((key[pos:end], *tail) for tail in cut(end + len(literal), i + 1))
            if len(out) > 1:
                break
        return tuple(out[:2])

    if len(literals) == 1:  # no placeholders: the key is the template
        return ((),) if key == literals[0] else ()
    return cut(len(literals[0]), 0)


def _occurrences(text: str, literal: str, start: int) -> Iterator[int]:
    at = text.find(literal, start)
    while at != -1:
        yield at
        at = text.find(literal, at + 1)


def stripe_refunds(
    *,
    api_key: str,
    base_url: str = STRIPE_API,
    effect: str = "refund:{payment_id}",
    amount: int | None = None,
    started_within: timedelta = timedelta(hours=24),
    ca_file: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> ReconcileHook:
    """A hook that asks Stripe whether the refund of an effect key happened.

    The key names the payment (``payment_id``, ``payment_intent`` or ``charge``) and maybe the
    ``amount``; a refund counts if Stripe's events show it was made with one of this key's
    ``ctrlrun.idempotency_token()`` values (pass that as the ``Idempotency-Key``), or if it is
    the only refund of that payment (of that amount, when known) created within
    ``started_within``. Against the fake Stripe that ships with ctrlrun:

    >>> from ctrlrun.testing import FakeStripe
    >>> with FakeStripe() as fake:
    ...     pi = fake.add_payment_intent(amount=5000)["id"]
    ...     hook = stripe_refunds(api_key="sk_test_1", base_url=fake.url, amount=500)
    ...     before = hook(f"refund:{pi}")
    ...     _ = fake.add_refund(payment_intent=pi, amount=500)
    ...     print(before, hook(f"refund:{pi}"))
    not_executed committed
    """
    template = _template(effect, needs=(("payment_id", "payment_intent", "charge"),))
    reconciler = StripeReconciler(base_url, api_key=api_key, ca_file=ca_file, timeout=timeout)
    defaults = {} if amount is None else {"amount": amount}

    def hook(effect_key: str) -> ReconcileOutcome:
        args = _arguments(template, effect_key, defaults, ints=("amount",))
        if args is None:
            return "unknown"
        tokens = [idempotency_token_for(effect_key, n) for n in range(1, SDK_ATTEMPTS + 1)]
        return reconciler.answer(
            "stripe.refund",
            args,
            started_at=utc_now() - started_within,
            idempotency_keys=tokens,
            effect_key=effect_key,
        )

    return hook


def stripe_payment_intent_cancels(
    *,
    api_key: str,
    base_url: str = STRIPE_API,
    effect: str = "cancel:{payment_intent}",
    ca_file: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> ReconcileHook:
    """A hook that asks Stripe whether the payment intent of an effect key is canceled.

    >>> from ctrlrun.testing import FakeStripe
    >>> with FakeStripe() as fake:
    ...     pi = fake.add_payment_intent(status="canceled")["id"]
    ...     hook = stripe_payment_intent_cancels(api_key="sk_test_1", base_url=fake.url)
    ...     print(hook(f"cancel:{pi}"))
    committed
    """
    template = _template(effect, needs=(("payment_intent", "payment_id"),))
    reconciler = StripeReconciler(base_url, api_key=api_key, ca_file=ca_file, timeout=timeout)

    def hook(effect_key: str) -> ReconcileOutcome:
        args = _arguments(template, effect_key, {})
        if args is None:
            return "unknown"
        return reconciler.answer(
            "stripe.cancel_payment_intent", args, started_at=utc_now(), effect_key=effect_key
        )

    return hook


def kubernetes_scale(
    *,
    server: str,
    token: str | None = None,
    ca_file: str | None = None,
    effect: str = "scale:{cluster}:{deployment}:{replicas}",
    namespace: str = "default",
    timeout: float = DEFAULT_TIMEOUT,
) -> ReconcileHook:
    """A hook that asks the apiserver whether a deployment has the replicas of an effect key.

    >>> from ctrlrun.testing import FakeKubernetes
    >>> with FakeKubernetes() as fake:
    ...     _ = fake.add_deployment("default", "web", replicas=6)
    ...     hook = kubernetes_scale(server=fake.url, token="t")
    ...     print(hook("scale:eu:web:6"), hook("scale:eu:web:3"))
    committed not_executed
    """
    template = _template(effect, needs=(("deployment",), ("replicas",)))
    reconciler = KubernetesReconciler(server, token=token, ca_file=ca_file, timeout=timeout)

    def hook(effect_key: str) -> ReconcileOutcome:
        args = _arguments(template, effect_key, {"namespace": namespace}, ints=("replicas",))
        if args is None:
            return "unknown"
        return reconciler.answer("k8s.scale", args, effect_key=effect_key)

    return hook


def kubernetes_deletes(
    *,
    server: str,
    token: str | None = None,
    ca_file: str | None = None,
    effect: str = "delete:{cluster}:{namespace}:{deployment}",
    namespace: str = "default",
    timeout: float = DEFAULT_TIMEOUT,
) -> ReconcileHook:
    """A hook that asks the apiserver whether the object of an effect key is deleted.

    A template with ``{deployment}`` names a deployment (in ``{namespace}``, else
    ``namespace``); one with ``{name}`` and no ``{deployment}`` names a namespace.

    >>> from ctrlrun.testing import FakeKubernetes
    >>> with FakeKubernetes() as fake:
    ...     _ = fake.add_namespace("shop")
    ...     hook = kubernetes_deletes(server=fake.url, effect="drop:{cluster}:{name}")
    ...     print(hook("drop:eu:shop"), hook("drop:eu:gone"))
    not_executed committed
    """
    template = _template(effect, needs=(("deployment", "name"),))
    action = "k8s.delete_deployment" if "deployment" in template.names else "k8s.delete_namespace"
    reconciler = KubernetesReconciler(server, token=token, ca_file=ca_file, timeout=timeout)
    defaults = {"namespace": namespace} if action == "k8s.delete_deployment" else {}

    def hook(effect_key: str) -> ReconcileOutcome:
        args = _arguments(template, effect_key, defaults)
        if args is None:
            return "unknown"
        return reconciler.answer(action, args, effect_key=effect_key)

    return hook


def _template(text: str, *, needs: tuple[tuple[str, ...], ...]) -> Template:
    """Parse a factory's effect template; each group of ``needs`` must have a name in it."""
    try:
        template = parse_template(text)
    except TemplateSyntaxError as exc:
        raise InvalidArgument(f"effect template: {exc}") from None
    for group in needs:
        if not set(group) & set(template.names):
            raise InvalidArgument(
                f"effect template {text!r} must name {' or '.join(f'{{{n}}}' for n in group)}"
            )
    return template


def _arguments(
    template: Template,
    key: str,
    defaults: Mapping[str, Any],
    *,
    ints: Collection[str] = (),
) -> dict[str, Any] | None:
    parsed = parse_effect_key(template, key, ints=ints)
    if parsed is None:
        log.warning("effect key %r does not read back through %r", key, template.text)
        return None
    return {**defaults, **parsed}
