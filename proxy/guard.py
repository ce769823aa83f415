"""The protected path: one consequential request, from route to receipt, in small steps::

    prepare   pure: route -> action -> effect key -> idempotency key, credentials
    admit     the kernel, as a ledger decision: begin (or claim a same-key replay)
    forward   the h1 forwarder, within the upstream's deadline
    settle    classify, record (a second decision), reconcile eagerly if ambiguous
    answer    the remote's own reply, or ctrlrun's answer in the remote's error shape

``Guard.handle`` returns ``PassThrough`` (not consequential: mitmproxy forwards it) or a
``Handled``: the response and the decision behind it. No store call waits on the event loop:
``begin`` and ``finish`` are ledger decisions (``ctrlrun.decisions``), those of concurrent
requests sharing a COMMIT, run on the loop's thread only when nothing can make them wait
(else on the ledger's decision thread); reconciles take a worker thread each.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from ctrlrun import ledger
from ctrlrun.action import Principal
from ctrlrun.attempt import Attempt
from ctrlrun.control import Control, ReconcileFirst
from ctrlrun.decisions import decide
from ctrlrun.reconcilers.base import ProxyReconciler
from ctrlrun.reconcilers.sweep import facts_for

from . import kube_gate, queue_cap, receipted, relay, replay, settle, stripe_payments, unmapped
from .classify import classify
from .coalesce import Coalescer
from .config import Upstream
from .decision_log import decided_fields, traced
from .forward import Forwarded, Forwarder, forward_headers
from .handled import Handled
from .ledger_health import LedgerHealth
from .limits import Limits
from .metrics import Metrics
from .prepare import Prepared, Unresolvable, prepare, screen, upstream_headers
from .refusals import Refusal, refusal_for
from .route_values import KubeWrite
from .routes import Invalid, Mapped, PassThrough, Request, Unmapped, map_request
from .stripe_recorded import as_recorded

log = logging.getLogger(__name__)


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
        limits: Callable[[], Limits] = Limits,
    ) -> None:
        self.limits = limits
        self.metrics = metrics or Metrics()
        self.health = LedgerHealth(self.metrics.ledger_available)
        self.control = control
        self.forwarder = forwarder
        self.reconcilers = reconcilers
        self.reconcile_deadline = reconcile_deadline
        self.inflight: Coalescer[Handled] = Coalescer()
        self.active = 0  # protected requests being handled, for a graceful stop

    async def handle(
        self,
        upstream: Upstream,
        request: Request,
        *,
        target: str,
        headers: Sequence[tuple[str, str]],
        principal: Principal | None,
    ) -> Handled | PassThrough | relay.Relayed:
        mapped = map_request(upstream, request)
        if isinstance(mapped, PassThrough):
            return mapped
        self.active += 1
        try:
            if isinstance(mapped, KubeWrite) and principal is None:
                mapped = Unmapped("no principal: nothing is asked of the apiserver")
            if isinstance(mapped, KubeWrite):  # decided on the apiserver's dry run
                protected = kube_gate.protected(
                    self, upstream, request, mapped, target, headers, principal
                )
            else:
                protected = self.protected(upstream, request, mapped, target, headers, principal)
            agent = principal.agent if principal else None  # one span, with its decision
            return await traced(protected, headers, self.control, agent=agent)
        finally:
            self.active -= 1

    async def protected(
        self,
        up: Upstream,
        request: Request,
        mapped: Mapped | Unmapped | Invalid,
        target: str,
        headers: Sequence[tuple[str, str]],
        principal: Principal | None,
    ) -> Handled | relay.Relayed:
        """prepare -> admit -> forward -> settle -> answer; any step may answer early."""
        screened = screen(up, request, mapped, principal)
        if isinstance(screened, Refusal):
            return await self._receipted(up, request, mapped, screened, principal)
        ctl = self.control()
        route, who = screened.route, screened.principal
        if isinstance(route, Unmapped):
            return await unmapped.forward(self, ctl, up, request, target, headers, who)
        if up.profile == "stripe":
            # Which payment a refund names, asked of Stripe when only its charge is given.
            named = await stripe_payments.resolve(self.forwarder, up, request, route, ctl.policy)
            if isinstance(named, Refusal):
                return await self._receipted(up, request, route, named, who)
            route = named
        prepared = prepare(up, request, route, who, ctl.policy, ctl.environment)
        if isinstance(prepared, Refusal):
            return await self._receipted(up, request, route, prepared, who)
        if isinstance(prepared, Unresolvable):
            return await self._unresolvable(ctl, up, request, prepared)
        p = await as_recorded(ctl, up, prepared, ctl.policy.effect_template(route.action))
        if isinstance(p, Refusal):
            return self.refused(up, request, p)
        if ctl.policy.mode != "observe":
            cap = self.limits().pending_approvals_per_agent
            full = await queue_cap.queue_full(ctl, p.action, p.approval_id, cap)
            if full is not None:
                return self.refused(up, request, await receipted.write(ctl, full, p.action))
        waiting = self.inflight.join(p.effect_key, p.idempotency_key, p.digest)
        if waiting is not None:
            # The client's own transport retry of an attempt still executing: same answer.
            return await asyncio.shield(waiting)
        admitted = await self._admit(ctl, up, p)
        if isinstance(admitted, Refusal):
            return self.refused(up, request, admitted)
        if isinstance(admitted, replay.Claimed):
            return await self._replay(ctl, up, request, p, admitted, target, headers)
        if relay.is_relayed(p):
            return relay.Relayed(ctl, up, p, admitted)  # mitmproxy relays it; the addon settles
        fallback = functools.partial(self._failed, up, request, p)
        with self.inflight.lead(p.effect_key, p.idempotency_key, p.digest, fallback) as flight:
            handled = await self._attempt(ctl, up, request, p, admitted, target, headers)
            flight.resolve(handled)
        return handled

    async def _unresolvable(
        self, ctl: Control, up: Upstream, request: Request, bad: Unresolvable
    ) -> Handled:
        """Refuse an action whose effect key cannot be resolved, with a receipt saying why."""
        try:
            receipt = await decide(ctl.store, ctl.refuse_effect_key, bad.action, bad.error)
        except Exception as exc:  # the refusal's receipt could not be written: still refused
            refusal = self._note_ledger(refusal_for(exc, action=bad.action.name), exc)
            return self.refused(up, request, refusal)
        refusal = refusal_for(bad.error, action=bad.action.name, receipt_id=receipt.receipt_id)
        return self.refused(up, request, refusal)

    async def _receipted(
        self,
        up: Upstream,
        request: Request,
        mapped: Mapped | Unmapped | Invalid,
        refusal: Refusal,
        principal: Principal | None,
    ) -> Handled:
        """Refuse a request the policy never saw, with a receipt saying what and why."""
        try:
            ctl = self.control()
        except Exception as exc:  # refused all the same; the missing receipt is said loudly
            log.error("receipt of refused %s not written: %s", request.method, type(exc).__name__)
            return self.refused(up, request, refusal)
        if isinstance(mapped, Mapped):
            name = mapped.action
        else:
            name = f"{up.name}.{'unmapped_write' if isinstance(mapped, Unmapped) else 'invalid'}"
        action = receipted.refusal_action(
            name,
            method=request.method,
            upstream=up.name,
            path=request.path,
            principal=principal,
            environment=ctl.environment,
        )
        return self.refused(up, request, await receipted.write(ctl, refusal, action))

    def _failed(self, up: Upstream, request: Request, p: Prepared, exc: BaseException) -> Handled:
        return self.refused(up, request, settle.failed_forwarding(p, exc))

    def refused(self, up: Upstream, request: Request, refusal: Refusal) -> Handled:
        """ctrlrun's answer for ``refusal``, counted and logged (one line per decision)."""
        self.metrics.decisions.labels(refusal.action or "-", refusal.outcome).inc()
        if refusal.reason != "store_unavailable":  # an outage is logged once, by self.health
            log.info(
                "refused %s %s: %s (%s)",
                request.method,
                request.path,
                refusal.outcome,
                refusal.reason,
                extra=decided_fields(refusal, self.control),
            )
        return Handled(
            refusal.answer(up.profile),
            refusal.outcome,
            refusal.reason,
            refusal.action,
            refusal.effect_key,
            refusal.receipt_id,
        )

    # -- admit ------------------------------------------------------------------------------

    async def _admit(
        self, ctl: Control, up: Upstream, p: Prepared
    ) -> Attempt | replay.Claimed | Refusal:
        """The kernel's decision, in a batch with the decisions queued beside it (one COMMIT):
        an attempt, a replay or a refusal. A key left ambiguous that the reconciler may settle
        is asked on a worker thread of its own, outside any batch."""
        lease = timedelta(seconds=up.timeout + self.reconcile_deadline + 60)
        lazy = self._hook(ctl, up, p.credentials)

        def admit() -> Attempt | replay.Claimed | ReconcileFirst:
            claimed = replay.claim(ctl, p)
            if claimed is not None:
                return claimed
            return ctl.begin_once(
                p.action,
                p.effect_key,
                approval_id=p.approval_id,
                lease=lease,
                may_reconcile=lazy is not None,
                idempotency_key=p.idempotency_key,
                upstream=up.name,
            )

        try:
            admitted = await decide(ctl.store, admit)
            if isinstance(admitted, ReconcileFirst):
                assert lazy is not None
                admitted = await asyncio.to_thread(ctl.reconcile_first, admitted, lazy)
        except Exception as exc:  # every refusal, and every failure, refuses: fail closed
            refusal = refusal_for(
                exc, action=p.action.name, effect_key=p.effect_key, approval=p.approval_id
            )
            self._note_ledger(refusal, exc)
            if refusal.reason == "internal_error":
                log.exception("internal error admitting %s: refused", p.action.name)
            return refusal
        self.health.answered()
        return admitted

    def _note_ledger(self, refusal: Refusal, exc: BaseException) -> Refusal:
        """Note whether the ledger answered: an outage is counted, and logged once."""
        if refusal.reason == "store_unavailable":
            self.metrics.store_errors.inc()
            self.health.failed(refusal.action or "-", exc)
        else:
            self.health.answered()  # the kernel decided this refusal: the ledger answered
        return refusal

    def _hook(
        self, ctl: Control, up: Upstream, creds: Mapping[str, str]
    ) -> Callable[[str], Any] | None:
        """The upstream's reconciler as a kernel hook, with this request's credentials."""
        reconciler = self.reconcilers.get(up.name)
        if reconciler is None or up.reconcile == "off":
            return None

        def hook(effect_key: str) -> Any:
            with ctl.store.reading() as conn:
                row = ledger.get_effect_row(conn, effect_key)
            if row is None:
                return "unknown"
            return reconciler(facts_for(row, creds, clock=ctl.clock))

        return hook

    # -- forward, settle, answer ----------------------------------------------------------------

    async def _attempt(
        self,
        ctl: Control,
        up: Upstream,
        request: Request,
        p: Prepared,
        attempt: Attempt,
        target: str,
        headers: Sequence[tuple[str, str]],
    ) -> Handled:
        try:
            reply = await self._forward(up, request, p, attempt, target, headers)
            status, body = reply.status, reply.body
            outcome = classify(
                up.profile, p.action.name, status=status, transport=reply.transport, body=body
            )
        except BaseException as exc:
            # The request may have left: the record must say nobody knows.
            await self._record_lost(ctl, attempt, exc)
            if not isinstance(exc, Exception):
                raise  # cancelled: the flight's fallback answers any waiting retry
            log.error(
                "%s %s: %s after forwarding began", p.action.name, p.effect_key, type(exc).__name__
            )
            return self.refused(up, request, settle.failed_forwarding(p, exc))
        self.metrics.decisions.labels(p.action.name, outcome).inc()
        try:
            error = settle.record_error(reply, outcome)
            receipt = await decide(ctl.store, ctl.finish, attempt, outcome, error=error)
        except Exception as exc:
            log.error(
                "%s %s: outcome not recorded: %s", p.action.name, p.effect_key, type(exc).__name__
            )
            return self.refused(up, request, settle.not_recorded(p, reply, exc))
        found = None
        if settle.lost(reply, outcome):
            found = await self._eager(ctl, up, p, attempt)
        result = settle.verdict(p, reply, outcome, receipt.receipt_id, found)
        if isinstance(result, Refusal):
            return self.refused(up, request, result)
        return Handled(result, outcome, None, p.action.name, p.effect_key, receipt.receipt_id)

    async def _forward(
        self,
        up: Upstream,
        request: Request,
        p: Prepared,
        attempt: Attempt,
        target: str,
        headers: Sequence[tuple[str, str]],
    ) -> Forwarded:
        out = upstream_headers(up, p, headers, attempt.token)
        loop = asyncio.get_running_loop()
        started = loop.time()
        reply = await self.forwarder.send(up, request.method, target, out, request.body)
        self.metrics.upstream_latency.labels(up.name).observe(loop.time() - started)
        return reply

    async def _record_lost(self, ctl: Control, attempt: Attempt, exc: BaseException) -> None:
        """Record ``ambiguous`` for an attempt whose forwarding failed inside the proxy."""
        error = f"proxy error: {type(exc).__name__}"
        with contextlib.suppress(Exception):
            # Shielded: a cancellation must not stop the record from saying nobody knows.
            recorded = decide(ctl.store, ctl.finish, attempt, "ambiguous", error=error)
            await asyncio.shield(recorded)

    async def _eager(self, ctl: Control, up: Upstream, p: Prepared, attempt: Attempt) -> str:
        """Ask the reconciler now, within its deadline; what it found, as the agent reads it."""
        if up.reconcile != "eager" or not self.reconcilers.get(up.name) or p.effect_key is None:
            return "not asked"
        hook = self._hook(ctl, up, p.credentials)
        try:
            found = await asyncio.wait_for(
                asyncio.to_thread(ctl.eager_reconcile, attempt, hook, True),
                timeout=self.reconcile_deadline,
            )
        except TimeoutError:
            self.metrics.reconciliations.labels("unknown").inc()
            return "no answer in time (unknown)"
        except Exception as exc:  # the ledger failed under the reconciliation: nothing moved
            log.warning("eager reconciliation of %s failed: %s", p.effect_key, type(exc).__name__)
            found = None
        self.metrics.reconciliations.labels(str(found or "unknown")).inc()
        return str(found or "unknown")

    # -- the two other ways a write is forwarded ------------------------------------------------

    async def _replay(
        self,
        ctl: Control,
        up: Upstream,
        request: Request,
        p: Prepared,
        claimed: replay.Claimed,
        target: str,
        headers: Sequence[tuple[str, str]],
    ) -> Handled:
        """Forward a same-key Stripe retry of an ambiguous attempt (Stripe deduplicates it).
        Its answer settles that attempt only, and only if it is evidence about it
        (``replay.evidence``); otherwise the agent is told the record stays ambiguous."""
        reply = await self.forwarder.send(
            up, request.method, target, forward_headers(headers), request.body
        )
        found = replay.evidence(reply)
        await asyncio.to_thread(
            ctl.reconciler.settle, claimed.effect_key, found, about=claimed.about
        )
        log.info("same-key retry of ambiguous %s forwarded: %s", claimed.effect_key, found)
        if found == "unknown":
            return self.refused(up, request, replay.inconclusive(p, reply, claimed.effect_key))
        outcome = "committed" if found == "committed" else "failed"
        return Handled(reply, outcome, replay.TRIGGER, p.action.name, claimed.effect_key)
