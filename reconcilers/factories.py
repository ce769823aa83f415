"""SDK reconcile hooks over the built-ins, given the attempt's facts by the kernel.

Each factory returns an :class:`AttemptHook`. The kernel asks it with the attempt's
:class:`~ctrlrun.reconcile.EffectFacts` (``reconcile_attempt``): the call's arguments, the
attempt number (so the one ``ctrlrun.idempotency_token()`` the function was given), when it
started and when it was recorded ambiguous, on the ledger's clock. It answers ``not_executed``
only once the settle window is over (``settle`` after the attempt was recorded ambiguous: the
remote may go on applying a request whose sender gave up). Arguments come from the effect key
(the factory's effect template read backwards, :func:`parse_effect_key`), then the call's
arguments, then the factory's keyword arguments. Called with a bare effect key, as any
``Callable[[str], ReconcileOutcome]``, it knows no attempt: it reads the key alone and has no
settle window::

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
from collections.abc import Callable, Collection, Iterator, Mapping
from datetime import timedelta
from typing import Any

from ctrlrun.action import utc_now
from ctrlrun.context import idempotency_token_for
from ctrlrun.errors import InvalidArgument
from ctrlrun.reconcile import EffectFacts, ReconcileOutcome
from ctrlrun.templates import Template, TemplateSyntaxError, parse_template

from .http import DEFAULT_TIMEOUT, SETTLE_MARGIN
from .kubernetes import KubernetesReconciler
from .stripe import STRIPE_API, StripeReconciler

log = logging.getLogger(__name__)

_PLACEHOLDER = re.compile(r"\{[^{}]*\}")
# Asked with a bare key, a hook does not know which attempt it is asked about; any of these
# attempts' tokens (``ctrlrun.idempotency_token()``) found in Stripe's events identifies it.
SDK_ATTEMPTS = 32
SETTLE = timedelta(seconds=SETTLE_MARGIN)
Answer = Callable[[str, EffectFacts | None], ReconcileOutcome]


class AttemptHook:
    """A reconcile hook that takes the attempt's facts, and still answers a bare effect key."""

    def __init__(self, answer: Answer, name: str) -> None:
        self._answer = answer
        self.__name__ = self.__qualname__ = name

    def __repr__(self) -> str:
        return f"<ctrlrun reconcile hook {self.__name__}>"

    def __call__(self, effect_key: str) -> ReconcileOutcome:
        return self._answer(effect_key, None)

    def reconcile_attempt(self, facts: EffectFacts) -> ReconcileOutcome:
        """What happened to this attempt (the kernel's call)."""
        return self._answer(facts.effect_key, facts)


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
    settle: timedelta = SETTLE,
) -> AttemptHook:
    """A hook that asks Stripe whether the refund of an effect key happened.

    The key names the payment (``payment_id``, ``payment_intent`` or ``charge``) and maybe the
    ``amount``; a refund counts if Stripe's events show it was made with the attempt's
    ``ctrlrun.idempotency_token()`` (pass that as the ``Idempotency-Key``), or if it is the only
    refund of that payment (of that amount, when known) created since the attempt started
    (asked with a bare key: within ``started_within``). Against the fake Stripe that ships with
    ctrlrun:

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
    reconciler = StripeReconciler(
        base_url, api_key=api_key, ca_file=ca_file, timeout=timeout, settle_margin=_seconds(settle)
    )
    defaults = {} if amount is None else {"amount": amount}

    def answer(effect_key: str, facts: EffectFacts | None) -> ReconcileOutcome:
        args = _arguments(template, effect_key, defaults, facts, ints=("amount",))
        if args is None:
            return "unknown"
        if facts is None:
            started = utc_now() - started_within
            tokens = [idempotency_token_for(effect_key, n) for n in range(1, SDK_ATTEMPTS + 1)]
        else:
            started = facts.attempt_started_at
            tokens = [idempotency_token_for(effect_key, facts.attempt)]
        return reconciler.answer(
            "stripe.refund",
            args,
            started_at=started,
            idempotency_keys=tokens,
            effect_key=effect_key,
            facts=facts,
        )

    return AttemptHook(answer, "stripe_refunds")


def stripe_payment_intent_cancels(
    *,
    api_key: str,
    base_url: str = STRIPE_API,
    effect: str = "cancel:{payment_intent}",
    ca_file: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    settle: timedelta = SETTLE,
) -> AttemptHook:
    """A hook that asks Stripe whether the payment intent of an effect key is canceled.

    >>> from ctrlrun.testing import FakeStripe
    >>> with FakeStripe() as fake:
    ...     pi = fake.add_payment_intent(status="canceled")["id"]
    ...     hook = stripe_payment_intent_cancels(api_key="sk_test_1", base_url=fake.url)
    ...     print(hook(f"cancel:{pi}"))
    committed
    """
    template = _template(effect, needs=(("payment_intent", "payment_id"),))
    reconciler = StripeReconciler(
        base_url, api_key=api_key, ca_file=ca_file, timeout=timeout, settle_margin=_seconds(settle)
    )

    def answer(effect_key: str, facts: EffectFacts | None) -> ReconcileOutcome:
        args = _arguments(template, effect_key, {}, facts)
        if args is None:
            return "unknown"
        started = utc_now() if facts is None else facts.attempt_started_at
        return reconciler.answer(
            "stripe.cancel_payment_intent",
            args,
            started_at=started,
            effect_key=effect_key,
            facts=facts,
        )

    return AttemptHook(answer, "stripe_payment_intent_cancels")


def kubernetes_scale(
    *,
    server: str,
    token: str | None = None,
    ca_file: str | None = None,
    effect: str = "scale:{cluster}:{deployment}:{replicas}",
    namespace: str = "default",
    timeout: float = DEFAULT_TIMEOUT,
    settle: timedelta = SETTLE,
) -> AttemptHook:
    """A hook that asks the apiserver whether a deployment has the replicas of an effect key.

    >>> from ctrlrun.testing import FakeKubernetes
    >>> with FakeKubernetes() as fake:
    ...     _ = fake.add_deployment("default", "web", replicas=6)
    ...     hook = kubernetes_scale(server=fake.url, token="t")
    ...     print(hook("scale:eu:web:6"), hook("scale:eu:web:3"))
    committed not_executed
    """
    template = _template(effect, needs=(("deployment",), ("replicas",)))
    reconciler = KubernetesReconciler(
        server, token=token, ca_file=ca_file, timeout=timeout, settle_margin=_seconds(settle)
    )

    def answer(effect_key: str, facts: EffectFacts | None) -> ReconcileOutcome:
        defaults = {"namespace": namespace}
        args = _arguments(template, effect_key, defaults, facts, ints=("replicas",))
        if args is None:
            return "unknown"
        return reconciler.answer("k8s.scale", args, effect_key=effect_key, facts=facts)

    return AttemptHook(answer, "kubernetes_scale")


def kubernetes_deletes(
    *,
    server: str,
    token: str | None = None,
    ca_file: str | None = None,
    effect: str = "delete:{cluster}:{namespace}:{deployment}",
    namespace: str = "default",
    timeout: float = DEFAULT_TIMEOUT,
    settle: timedelta = SETTLE,
) -> AttemptHook:
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
    reconciler = KubernetesReconciler(
        server, token=token, ca_file=ca_file, timeout=timeout, settle_margin=_seconds(settle)
    )
    defaults = {"namespace": namespace} if action == "k8s.delete_deployment" else {}

    def answer(effect_key: str, facts: EffectFacts | None) -> ReconcileOutcome:
        args = _arguments(template, effect_key, defaults, facts)
        if args is None:
            return "unknown"
        return reconciler.answer(action, args, effect_key=effect_key, facts=facts)

    return AttemptHook(answer, "kubernetes_deletes")


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
    facts: EffectFacts | None,
    *,
    ints: Collection[str] = (),
) -> dict[str, Any] | None:
    """What the reconciler asks about: the key's values, over the call's arguments, over the
    factory's keyword arguments."""
    parsed = parse_effect_key(template, key, ints=ints)
    if parsed is None:
        log.warning("effect key %r does not read back through %r", key, template.text)
        return None
    called = {} if facts is None else dict(facts.arguments)
    return {**defaults, **called, **parsed}


def _seconds(settle: timedelta) -> float:
    if not isinstance(settle, timedelta) or settle < timedelta(0):
        raise InvalidArgument("settle must be a timedelta of zero or more")
    return settle.total_seconds()
