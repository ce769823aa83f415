"""The protected path: one consequential request, from route to receipt.

``Guard.handle`` returns ``None`` (not ours: let mitmproxy forward it), an ``Answer``
(ctrlrun answers instead of the remote) or a ``Reply`` (the remote's own answer). Store
calls run in worker threads so one slow request never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ctrlrun import ledger
from ctrlrun.action import Action, Principal, parse_iso, utc_now
from ctrlrun.control import Control
from ctrlrun.errors import (
    ActionDenied,
    AmbiguousEffect,
    ApprovalMismatch,
    ApprovalRequired,
    CTRLRunError,
    DuplicateEffect,
    EffectKeyError,
    InvalidArgument,
)
from ctrlrun.policy import Decision
from ctrlrun.reconcilers.base import ProxyReconciler
from ctrlrun.reconcilers.sweep import facts_for
from ctrlrun.states import EffectState

from .answers import Answer, answer
from .classify import Outcome, classify
from .config import Upstream
from .forward import Forwarder, Reply, forward_headers
from .metrics import Metrics
from .routes import Invalid, Mapped, PassThrough, Request, Unmapped, map_request

log = logging.getLogger("ctrlrun.proxy")
REPLAY_WINDOW = timedelta(hours=23)  # Stripe keeps idempotency keys for at least 24 hours


@dataclass
class _InFlight:
    idempotency_key: str | None
    digest: str
    done: asyncio.Future[Reply | Answer]


class Guard:
    """Decides, forwards and records protected requests for a set of upstreams."""

    def __init__(
        self,
        control: Callable[[], Control],
        forwarder: Forwarder,
        reconcilers: Mapping[str, ProxyReconciler | None],
        *,
        reconcile_deadline: float = 10.0,
        metrics: Metrics | None = None,
    ) -> None:
        self.metrics = metrics or Metrics()
        self.control = control
        self.forwarder = forwarder
        self.reconcilers = reconcilers
        self.reconcile_deadline = reconcile_deadline
        self.inflight: dict[str, _InFlight] = {}
        self.active = 0  # protected requests being handled, for a graceful stop

    async def handle(
        self,
        upstream: Upstream,
        request: Request,
        *,
        target: str,
        headers: Sequence[tuple[str, str]],
        principal: Principal | None,
    ) -> Answer | Reply | None:
        mapped = map_request(upstream, request)
        if isinstance(mapped, PassThrough):
            return None
        self.active += 1
        try:
            return await self._protected(upstream, request, mapped, target, headers, principal)
        finally:
            self.active -= 1

    async def _protected(
        self,
        up: Upstream,
        request: Request,
        mapped: Mapped | Unmapped | Invalid,
        target: str,
        headers: Sequence[tuple[str, str]],
        principal: Principal | None,
    ) -> Answer | Reply:
        def refuse(
            outcome: str,
            reason: str,
            message: str,
            *,
            action: str | None = None,
            key: str | None = None,
            receipt: str | None = None,
            request_id: str | None = None,
            exc: BaseException | None = None,
        ) -> Answer:
            if receipt is None and isinstance(exc, CTRLRunError):
                receipt = exc.receipt_id
            self.metrics.decisions.labels(action or "-", outcome).inc()
            log.info("refused %s %s: %s (%s)", request.method, request.path, outcome, reason)
            return answer(
                up.profile,
                outcome,
                reason=reason,
                message=message,
                action=action,
                effect_key=key,
                receipt_id=receipt,
                request_id=request_id,
            )

        if isinstance(mapped, Invalid):
            return refuse("invalid_request", mapped.reason, f"request refused: {mapped.reason}")
        if principal is None:
            return refuse(
                "denied",
                "no_principal",
                "request refused: no principal (configure --principal or send Proxy-Authorization)",
            )
        ctl = self.control()
        if isinstance(mapped, Unmapped):
            if up.unmapped_writes == "deny":
                return refuse(
                    "denied",
                    "unmapped_write",
                    f"{request.method} {request.path} matches no route of upstream {up.name!r}",
                )
            return await self._unmapped(ctl, up, request, target, headers, principal)
        try:
            action = Action(mapped.action, mapped.arguments, principal, None, ctl.environment)
        except InvalidArgument as exc:
            return refuse("invalid_request", "invalid_argument", str(exc), action=mapped.action)
        key: str | None = None
        template = ctl.policy.effect_template(action.name)
        if template is not None:
            try:
                key = template.resolve(action.arguments)
            except EffectKeyError as exc:
                receipt = await asyncio.to_thread(ctl.refuse_effect_key, action, exc)
                return refuse(
                    "invalid_request",
                    "effect_key_error",
                    str(exc),
                    action=action.name,
                    receipt=receipt.receipt_id,
                )
        hdr = {k.lower(): v for k, v in headers}
        idem = hdr.get("idempotency-key") if up.profile == "stripe" else None
        creds = {k: v for k, v in hdr.items() if k in ("authorization", "stripe-account")}
        digest = hashlib.sha256(request.body).hexdigest()
        if key is not None:
            same = self.inflight.get(key)
            if same is not None and idem and same.idempotency_key == idem and same.digest == digest:
                # The client's own transport retry of an attempt still executing: same answer.
                return await asyncio.shield(same.done)
            if idem:
                replay = await self._replay_ambiguous(
                    ctl, up, action, key, idem, target, headers, request
                )
                if replay is not None:
                    return replay
        lazy = self._lazy_hook(up, creds)
        try:
            attempt = await asyncio.to_thread(
                ctl.begin,
                action,
                key,
                approval_id=hdr.get("ctrlrun-approval"),
                lease=timedelta(seconds=up.timeout + self.reconcile_deadline + 60),
                reconcile=lazy,
                idempotency_key=idem,
                upstream=up.name,
            )
        except DuplicateEffect as exc:
            return refuse(
                "duplicate" if exc.state == "committed" else "in_progress",
                exc.state,
                str(exc),
                action=action.name,
                key=key,
                exc=exc,
            )
        except AmbiguousEffect as exc:
            return refuse("ambiguous", "ambiguous", str(exc), action=action.name, key=key, exc=exc)
        except ApprovalRequired as exc:
            return refuse(
                "approval_required",
                "approval_required",
                f"{action.name} needs approval {exc.request_id}",
                action=action.name,
                key=key,
                request_id=exc.request_id,
            )
        except ApprovalMismatch as exc:
            return refuse(
                "approval_invalid",
                exc.reason,
                str(exc),
                action=action.name,
                key=key,
                request_id=exc.approval_id,
                exc=exc,
            )
        except ActionDenied as exc:
            if exc.reason == "approval_denied":  # a presented approval a human denied
                return refuse(
                    "approval_invalid",
                    exc.reason,
                    str(exc),
                    action=action.name,
                    key=key,
                    request_id=hdr.get("ctrlrun-approval"),
                    exc=exc,
                )
            return refuse("denied", exc.reason, str(exc), action=action.name, key=key, exc=exc)
        except CTRLRunError as exc:
            self.metrics.store_errors.inc()
            log.error("ledger unavailable for %s: %s", action.name, exc)
            return refuse(
                "unavailable",
                "store_unavailable",
                f"the ledger is unavailable: {exc}",
                action=action.name,
                key=key,
            )

        out_headers = forward_headers(headers)
        if up.profile == "stripe" and not idem and attempt.token:
            out_headers.append(("Idempotency-Key", attempt.token))
        flight = None
        if key is not None:
            flight = _InFlight(idem, digest, asyncio.get_running_loop().create_future())
            self.inflight[key] = flight
        result: Reply | Answer
        finished = False
        try:
            started = asyncio.get_running_loop().time()
            reply = await self.forwarder.send(up, request.method, target, out_headers, request.body)
            self.metrics.upstream_latency.labels(up.name).observe(
                asyncio.get_running_loop().time() - started
            )
            outcome = classify(
                up.profile,
                action.name,
                status=reply.status,
                transport=reply.transport,
                body=reply.body,
            )
            self.metrics.decisions.labels(action.name, outcome.value).inc()
            error = reply.error or (
                None if outcome is Outcome.COMMITTED else f"HTTP {reply.status}"
            )
            finished = True
            receipt = await asyncio.to_thread(ctl.finish, attempt, outcome.value, error=error)
            result = reply
            if reply.status is None and outcome is Outcome.FAILED:
                result = refuse(
                    "unavailable",
                    "upstream_unreachable",
                    f"the remote could not be reached ({error}); nothing was sent, "
                    "and the attempt is recorded failed",
                    action=action.name,
                    key=key,
                    receipt=receipt.receipt_id,
                )
            elif outcome is Outcome.AMBIGUOUS or reply.cut_short:
                found = "not asked"
                if up.reconcile == "eager" and self.reconcilers.get(up.name) and key is not None:
                    found = await self._eager(ctl, attempt, up, creds)
                result = refuse(
                    "upstream_ambiguous",
                    f"reconciler: {found}",
                    f"the remote's reply was lost ({error}); the reconciler found: {found}",
                    action=action.name,
                    key=key,
                    receipt=receipt.receipt_id,
                )
        except BaseException as exc:
            if not finished:
                # The request may have left: the record must say nobody knows.
                with contextlib.suppress(Exception):
                    await asyncio.shield(
                        asyncio.to_thread(
                            ctl.finish,
                            attempt,
                            "ambiguous",
                            error=f"proxy error: {type(exc).__name__}",
                        )
                    )
            if not isinstance(exc, Exception):
                raise
            log.error("%s %s: %s after forwarding began", action.name, key, type(exc).__name__)
            if finished:
                # Sent and answered; only recording failed (the ledger went away). The record
                # stays executing under its lease, so a retry is held.
                what = (
                    f"the request was sent and the remote answered {reply.status or reply.error}, "
                    f"but the ledger could not record it ({type(exc).__name__})"
                )
                reason = "outcome_not_recorded"
            else:
                what = (
                    f"the proxy failed while forwarding ({type(exc).__name__}); "
                    "the request may have reached the remote"
                )
                reason = "internal_error"
            result = refuse("upstream_ambiguous", reason, what, action=action.name, key=key)
            return result
        finally:
            if flight is not None:
                if not flight.done.done():
                    flight.done.set_result(result)
                if self.inflight.get(key or "") is flight:
                    del self.inflight[key or ""]
        return result

    def _lazy_hook(self, up: Upstream, creds: Mapping[str, str]) -> Callable[[str], Any] | None:
        reconciler = self.reconcilers.get(up.name)
        if reconciler is None or up.reconcile == "off":
            return None
        ctl = self.control()

        def hook(effect_key: str) -> Any:
            with ctl.store.reading() as conn:
                row = ledger.get_effect_row(conn, effect_key)
            if row is None:
                return "unknown"
            return reconciler(facts_for(row, creds))

        return hook

    async def _eager(
        self, ctl: Control, attempt: Any, up: Upstream, creds: Mapping[str, str]
    ) -> str:
        hook = self._lazy_hook(up, creds)
        try:
            found = await asyncio.wait_for(
                asyncio.to_thread(ctl.eager_reconcile, attempt, hook, True),
                timeout=self.reconcile_deadline,
            )
        except TimeoutError:
            self.metrics.reconciliations.labels("unknown").inc()
            return "no answer in time (unknown)"
        self.metrics.reconciliations.labels(str(found or "unknown")).inc()
        return str(found or "unknown")

    async def _replay_ambiguous(
        self,
        ctl: Control,
        up: Upstream,
        action: Action,
        key: str,
        idem: str,
        target: str,
        headers: Sequence[tuple[str, str]],
        request: Request,
    ) -> Reply | None:
        """Forward a same-key Stripe retry of an ambiguous attempt: Stripe deduplicates it."""
        if ctl.evaluate(action).decision is Decision.DENY:
            return None  # the policy now refuses the action: begin() records and says so

        def read() -> Any:
            with ctl.store.reading() as conn:
                return ledger.get_effect_row(conn, key)

        row = await asyncio.to_thread(read)
        if row is None or row["state"] != EffectState.AMBIGUOUS.value:
            return None
        if row["idempotency_key"] != idem:
            return None
        if utc_now() - parse_iso(row["updated_at"]) > REPLAY_WINDOW:
            return None
        if row["action_json"] != action.canonical.decode("utf-8"):
            # The old key on a changed request is not a transport retry: Stripe would refuse
            # it (idempotency_error), and that 400 says nothing about the first attempt.
            return None
        await asyncio.to_thread(ctl.reconciler.started, key, "idempotent_replay")
        reply = await self.forwarder.send(
            up, request.method, target, forward_headers(headers), request.body
        )
        outcome = classify(
            up.profile,
            action.name,
            status=reply.status,
            transport=reply.transport,
            body=reply.body,
        )
        found = {"committed": "committed", "failed": "not_executed"}.get(outcome.value, "unknown")
        await asyncio.to_thread(ctl.reconciler.settle, key, found)
        log.info("same-key retry of ambiguous %s forwarded: %s", key, found)
        return reply

    async def _unmapped(
        self,
        ctl: Control,
        up: Upstream,
        request: Request,
        target: str,
        headers: Sequence[tuple[str, str]],
        principal: Principal,
    ) -> Reply:
        reply = await self.forwarder.send(
            up, request.method, target, forward_headers(headers), request.body
        )
        outcome = classify(up.profile, "", status=reply.status, transport=reply.transport)
        action = Action(
            f"{up.name}.unmapped_write",
            {"method": request.method, "path": request.path},
            principal,
            None,
            ctl.environment,
        )
        try:
            await asyncio.to_thread(
                ctl.record_unprotected,
                action,
                outcome.value,
                reason="unmapped_writes: allow",
                error=reply.error,
            )
        except CTRLRunError as exc:
            # It has been forwarded (the policy allows unmapped writes): the agent gets the
            # remote's answer, and the missing receipt is said loudly.
            self.metrics.store_errors.inc()
            log.error(
                "receipt of unmapped %s %s not written: %s", request.method, request.path, exc
            )
        return reply
