"""What really happened to an ambiguous Kubernetes write, asked of the apiserver with GETs.

=========================  ======================================  ==========================
action                     committed                               not_executed
=========================  ======================================  ==========================
k8s.scale                  the scale's ``spec.replicas`` equals    it does not, or there is
                           the requested count                     no such deployment
k8s.delete_namespace,      404, or ``metadata.deletionTimestamp``  the object exists with no
k8s.delete_deployment      is set                                  ``deletionTimestamp``
=========================  ======================================  ==========================

Everything else, and everything unproven (unreachable, 5xx, 401/403, malformed answers), is
``unknown``. The bearer token is the producing request's own, else the upstream's
``token_file``, read at each call so a rotated service-account token is picked up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from ctrlrun.reconcile import ReconcileOutcome

from .base import EffectFacts
from .http import (
    DEFAULT_DEADLINE,
    DEFAULT_TIMEOUT,
    SETTLE_MARGIN,
    Miss,
    Reader,
    Remote,
    Verdict,
    bearer,
    dig,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KubernetesTarget:
    """Where a Kubernetes reconciler asks, and the service-account files it trusts and sends."""

    base_url: str
    token_file: str | None = None  # read at each call: a rotated token is picked up
    ca_file: str | None = None
    timeout: float = 30.0  # the deadline the writes are forwarded under (the settle window)


class KubernetesReconciler(Remote):
    """Answers for one Kubernetes upstream (see the module docstring for the table)."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        token_file: str | None = None,
        ca_file: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        deadline: float = DEFAULT_DEADLINE,
        transport: httpx.BaseTransport | None = None,
        write_timeout: float = 0.0,
        settle_margin: float = 0.0,
    ) -> None:
        super().__init__(
            base_url,
            ca_file=ca_file,
            timeout=timeout,
            deadline=deadline,
            transport=transport,
            write_timeout=write_timeout,
            settle_margin=settle_margin,
        )
        self.token_file = token_file
        self._token = token

    def __repr__(self) -> str:
        return f"KubernetesReconciler({self.base_url!r})"

    @classmethod
    def for_target(cls, target: KubernetesTarget) -> KubernetesReconciler:
        return cls(
            target.base_url,
            token_file=target.token_file,
            ca_file=target.ca_file,
            write_timeout=target.timeout,
            settle_margin=SETTLE_MARGIN,
        )

    def __call__(self, facts: EffectFacts) -> ReconcileOutcome:
        return self.answer(
            facts.action,
            facts.arguments,
            credentials=facts.credentials,
            effect_key=facts.effect_key,
            facts=facts,
        )

    def answer(
        self,
        action: str,
        arguments: Mapping[str, Any],
        *,
        credentials: Mapping[str, str] | None = None,
        effect_key: str = "",
        facts: EffectFacts | None = None,
    ) -> ReconcileOutcome:
        """Ask about one write, described by its action name and arguments (with ``facts``,
        the attempt's, its settle window applies: a write still in flight is not absent)."""
        ask: dict[str, Callable[[Reader, Mapping[str, Any]], Verdict]] = {
            "k8s.scale": _scale,
            "k8s.delete_namespace": _delete_namespace,
            "k8s.delete_deployment": _delete_deployment,
        }
        how = ask.get(action)
        verdict: Verdict = ("unknown", "no Kubernetes reconciler for this action")
        if how is not None:
            with Reader(
                self.base_url,
                headers=bearer(credentials or {}, self._token or self._read_token()),
                ca_file=self.ca_file,
                timeout=self.timeout,
                deadline=self.deadline,
                transport=self._transport,
            ) as reader:
                verdict = how(reader, arguments)
        if facts is not None:
            verdict = self.settle(verdict, facts)
        log.info("reconcile %s %s: %s (%s)", action, effect_key, *verdict)
        return verdict[0]

    def _read_token(self) -> str | None:
        if not self.token_file:
            return None
        try:
            return Path(self.token_file).read_text(encoding="utf-8").strip() or None
        except (OSError, UnicodeDecodeError) as exc:
            # Asked without a token, the apiserver answers 401/403: unknown, as it should be.
            log.warning("cannot read the token file %s: %s", self.token_file, type(exc).__name__)
            return None


def _scale(reader: Reader, args: Mapping[str, Any]) -> Verdict:
    path = _deployment_path(args)
    replicas = args.get("replicas")
    if isinstance(replicas, str) and replicas.isascii() and replicas.isdigit():
        replicas = int(replicas)
    if path is None or isinstance(replicas, bool) or not isinstance(replicas, int):
        return "unknown", "no namespace/deployment/replicas among the arguments"
    reply = reader.get(f"{path}/scale")
    if reply is Miss.NOT_FOUND:
        return "not_executed", "there is no such deployment"
    if isinstance(reply, Miss):
        return "unknown", "the scale could not be read"
    found, current = dig(reply, "spec.replicas")
    if not found or isinstance(current, bool) or not isinstance(current, int):
        return "unknown", "the scale has no spec.replicas"
    if current == replicas:
        return "committed", f"spec.replicas is {current}"
    return "not_executed", f"spec.replicas is {current}, not {replicas}"


def _delete_namespace(reader: Reader, args: Mapping[str, Any]) -> Verdict:
    name = args.get("name") or args.get("namespace")
    if not _is_name(name):
        return "unknown", "no namespace name among the arguments"
    return _deleted(reader, f"/api/v1/namespaces/{_segment(name)}")


def _delete_deployment(reader: Reader, args: Mapping[str, Any]) -> Verdict:
    path = _deployment_path(args)
    if path is None:
        return "unknown", "no namespace/deployment among the arguments"
    return _deleted(reader, path)


def _deleted(reader: Reader, path: str) -> Verdict:
    reply = reader.get(path)
    if reply is Miss.NOT_FOUND:
        return "committed", "the object is gone"
    if isinstance(reply, Miss):
        return "unknown", "the object could not be read"
    metadata = reply.get("metadata")
    if not isinstance(metadata, dict):
        return "unknown", "the object has no metadata"
    if metadata.get("deletionTimestamp"):
        return "committed", "the object is being deleted"
    return "not_executed", "the object exists with no deletionTimestamp"


def _deployment_path(args: Mapping[str, Any]) -> str | None:
    namespace, deployment = args.get("namespace", "default"), args.get("deployment")
    if not _is_name(namespace) or not _is_name(deployment):
        return None
    return f"/apis/apps/v1/namespaces/{_segment(namespace)}/deployments/{_segment(deployment)}"


def _is_name(value: Any) -> bool:
    return isinstance(value, str) and value not in ("", ".", "..")


def _segment(value: Any) -> str:
    return quote(str(value), safe="")
