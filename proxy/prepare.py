"""The first step of a protected request, pure: route -> action -> effect key -> idempotency.

Nothing here reads the ledger or the network. ``screen`` refuses what needs no policy (an
unreadable write, no principal, an unmapped write the upstream denies); ``prepare`` builds the
action, resolves its effect key and gathers what later steps need from the request's headers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ctrlrun.action import Action, Principal
from ctrlrun.control import build_action
from ctrlrun.errors import EffectKeyError, InvalidArgument
from ctrlrun.policy import Policy

from .config import Upstream
from .forward import forward_headers
from .key_spellings import refuse_respelt
from .numbers import as_numbers
from .refusals import Refusal, refusal_for
from .routes import Invalid, Mapped, Request, Unmapped

# Request headers a reconciler may use to ask the remote about this attempt (memory only).
CREDENTIAL_HEADERS = ("authorization", "stripe-account")


@dataclass(frozen=True)
class Prepared:
    """A mapped write, ready to be admitted by the kernel."""

    action: Action
    effect_key: str | None
    idempotency_key: str | None  # the client's own (Stripe), kept with the attempt
    approval_id: str | None  # from Ctrlrun-Approval
    digest: str  # SHA-256 of the body: a same-key retry must carry the same request
    credentials: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Screened:
    """A readable write with a principal: it goes on to the policy."""

    route: Mapped | Unmapped
    principal: Principal


@dataclass(frozen=True)
class Unresolvable:
    """The action's effect key cannot be resolved: refused, with a receipt to write first."""

    action: Action
    error: EffectKeyError


def screen(
    up: Upstream, request: Request, mapped: Mapped | Unmapped | Invalid, principal: Principal | None
) -> Refusal | Screened:
    """Refuse what no policy could allow; else what goes on to the policy."""
    if isinstance(mapped, Invalid):
        return Refusal("invalid_request", mapped.reason, f"request refused: {mapped.reason}")
    if principal is None:
        return Refusal(
            "denied",
            "no_principal",
            "request refused: no principal (configure --principal or send Proxy-Authorization)",
        )
    if isinstance(mapped, Unmapped) and up.unmapped_writes == "deny":
        return Refusal(
            "denied",
            "unmapped_write",
            f"{request.method} {request.path} matches no route of upstream {up.name!r}",
        )
    return Screened(mapped, principal)


def prepare(
    up: Upstream,
    request: Request,
    mapped: Mapped,
    principal: Principal,
    policy: Policy,
    environment: str,
) -> Prepared | Unresolvable | Refusal:
    """The action, its effect key and the request facts the kernel and reconciler need."""
    arguments = as_numbers(policy, mapped.action, mapped.arguments)
    if isinstance(arguments, Refusal):
        return arguments
    try:
        action = build_action(policy, mapped.action, arguments, principal, environment)
    except InvalidArgument as exc:
        return refusal_for(exc, action=mapped.action)
    key: str | None = None
    template = policy.effect_template(action.name)
    if template is not None:
        if up.profile == "http":
            respelt = refuse_respelt(template.names, arguments, action.name)
            if respelt is not None:
                return respelt
        try:
            key = template.resolve(action.arguments, resource=action.resource)
        except EffectKeyError as exc:
            return Unresolvable(action, exc)
    headers = request.headers  # lower-case names
    return Prepared(
        action,
        key,
        headers.get("idempotency-key") if up.profile == "stripe" else None,
        headers.get("ctrlrun-approval"),
        hashlib.sha256(request.body).hexdigest(),
        {k: v for k, v in headers.items() if k in CREDENTIAL_HEADERS},
    )


def upstream_headers(
    up: Upstream, prepared: Prepared, headers: Sequence[tuple[str, str]], token: str | None
) -> list[tuple[str, str]]:
    """The headers to forward: a Stripe write without a key gets the attempt's own."""
    out = forward_headers(headers)
    if up.profile == "stripe" and not prepared.idempotency_key and token:
        out.append(("Idempotency-Key", token))
    return out
