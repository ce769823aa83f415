"""What really happened to an ambiguous Kubernetes write, asked of the apiserver with GETs.

=========================  ======================================  ==========================
action                     committed                               not_executed
=========================  ======================================  ==========================
k8s.scale                  the scale's ``spec.replicas`` equals    it does not and nobody
                           the requested count                     wrote the deployment since
                                                                   the attempt began
                                                                   (``managedFields``), or
                                                                   there is no such deployment
k8s.delete_namespace,      404, or ``metadata.deletionTimestamp``  the object exists with no
k8s.delete_deployment      is set                                  ``deletionTimestamp``, made
                                                                   before the attempt began
=========================  ======================================  ==========================

The apiserver's times (``managedFields[].time``, ``creationTimestamp``) are placed on the
ledger's clock by the answer's ``Date`` (which every apiserver sends): ``managedFields`` with no
``Date`` make the scale ``unknown``; a ``creationTimestamp`` is only judged with one.
Everything else, and everything unproven (unreachable, 5xx, 401/403, malformed answers, an
object of another name or namespace, a 404 that is not the apiserver's ``NotFound`` Status
naming the object), is ``unknown``. The bearer token is the producing request's own, else the
upstream's ``token_file``, read at each call so a rotated service-account token is picked up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeGuard
from urllib.parse import quote

import httpx

from ctrlrun.reconcile import ReconcileOutcome, evidenced

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
        ask: dict[str, Callable[[Reader, Mapping[str, Any], datetime | None], Verdict]] = {
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
                wall=facts.clock if facts is not None else None,
            ) as reader:
                since = facts.attempt_started_at if facts is not None else None
                verdict = how(reader, arguments, since)
        if facts is not None:
            verdict = self.settle(verdict, facts)
        log.info("reconcile %s %s: %s (%s)", action, effect_key, *verdict)
        return evidenced(*verdict)

    def _read_token(self) -> str | None:
        if not self.token_file:
            return None
        try:
            return Path(self.token_file).read_text(encoding="utf-8").strip() or None
        except (OSError, UnicodeDecodeError) as exc:
            # Asked without a token, the apiserver answers 401/403: unknown, as it should be.
            log.warning("cannot read the token file %s: %s", self.token_file, type(exc).__name__)
            return None


Kind = tuple[str, str]  # (API group, resource), as an apiserver's ``Status`` details name them
NAMESPACES: Kind = ("", "namespaces")
DEPLOYMENTS: Kind = ("apps", "deployments")


@dataclass(frozen=True)
class _Object:
    """The object asked about: where to GET it, and how the apiserver names it."""

    path: str
    kind: Kind
    name: str
    namespace: str | None = None


def _scale(reader: Reader, args: Mapping[str, Any], since: datetime | None) -> Verdict:
    target = _deployment(args)
    replicas = args.get("replicas")
    if isinstance(replicas, str) and replicas.isascii() and replicas.isdigit():
        replicas = int(replicas)
    if target is None or isinstance(replicas, bool) or not isinstance(replicas, int):
        return "unknown", "no namespace/deployment/replicas among the arguments"
    reply = reader.get(f"{target.path}/scale")
    if reply is Miss.NOT_FOUND:
        if _absent(reader, target):
            return "not_executed", "there is no such deployment"
        return "unknown", "a 404 that is not the apiserver's word about this deployment"
    if isinstance(reply, Miss):
        return "unknown", "the scale could not be read"
    if not _is(reply, target):
        return "unknown", "the answer is not this deployment's scale"
    found, current = dig(reply, "spec.replicas")
    if not found or isinstance(current, bool) or not isinstance(current, int):
        return "unknown", "the scale has no spec.replicas"
    if current == replicas:
        return "committed", f"spec.replicas is {current}"
    # Another count proves nothing if someone wrote the deployment since the attempt began
    # (an HPA, a person, a rollback): the attempt's write may have landed, then been undone.
    if since is not None:
        deployment = reader.get(target.path)
        if isinstance(deployment, Miss) or not _is(deployment, target):
            return "unknown", "the deployment could not be read to see who wrote it last"
        if late := _written_since(reader, deployment, since):
            return "unknown", f"spec.replicas is {current}, but {late}"
    return "not_executed", f"spec.replicas is {current}, not {replicas}"


def _delete_namespace(reader: Reader, args: Mapping[str, Any], since: datetime | None) -> Verdict:
    name = args.get("name") or args.get("namespace")
    if not _is_name(name):
        return "unknown", "no namespace name among the arguments"
    target = _Object(f"/api/v1/namespaces/{_segment(name)}", NAMESPACES, name)
    return _deleted(reader, target, since)


def _delete_deployment(reader: Reader, args: Mapping[str, Any], since: datetime | None) -> Verdict:
    target = _deployment(args)
    if target is None:
        return "unknown", "no namespace/deployment among the arguments"
    return _deleted(reader, target, since)


def _deleted(reader: Reader, target: _Object, since: datetime | None) -> Verdict:
    reply = reader.get(target.path)
    if reply is Miss.NOT_FOUND:
        if _absent(reader, target):
            return "committed", "the object is gone"
        return "unknown", "a 404 that is not the apiserver's word about this object"
    if isinstance(reply, Miss):
        return "unknown", "the object could not be read"
    if not _is(reply, target):
        return "unknown", "the answer is not this object"
    metadata = reply["metadata"]
    if metadata.get("deletionTimestamp"):
        return "committed", "the object is being deleted"
    created = _remote_time(metadata.get("creationTimestamp"))
    if since is not None and reader.ahead is not None and _placed(created, reader, since):
        # Deleted by the attempt, then made again by someone else: not the object it deleted.
        return "unknown", "the object exists, but was created since the attempt began"
    return "not_executed", "the object exists with no deletionTimestamp"


def _written_since(reader: Reader, deployment: Mapping[str, Any], since: datetime) -> str | None:
    """Who wrote the deployment's spec or metadata since ``since``, from ``managedFields``
    (status writes are the controller's, which never sets replicas); None when nobody did."""
    fields = deployment["metadata"].get("managedFields")
    if not isinstance(fields, list):
        return None  # an apiserver that tracks no managers says nothing either way
    if reader.ahead is None:
        return "the apiserver's clock is unknown (no Date), so its managedFields cannot be placed"
    for entry in fields:
        if not isinstance(entry, dict) or entry.get("subresource") == "status":
            continue
        when = _remote_time(entry.get("time"))
        if _placed(when, reader, since):
            return f"{entry.get('manager', 'someone')} wrote it since the attempt began"
    return None


def _placed(remote: datetime | None, reader: Reader, since: datetime) -> bool:
    """A remote time (whole seconds) could be at or after ``since`` on the ledger's clock.
    A time that cannot be read could be anything: True."""
    if remote is None or reader.ahead is None:
        return True
    latest = remote + timedelta(seconds=1) + reader.ahead
    return latest >= (since if since.tzinfo else since.replace(tzinfo=UTC))


def _remote_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else None


def _absent(reader: Reader, target: _Object) -> bool:
    """The 404 is the apiserver's ``NotFound`` naming this object (an ingress's HTML page, a
    proxy's 404 or a path the apiserver does not serve prove nothing about it)."""
    status = reader.missing or {}
    details = status.get("details")
    return (
        status.get("kind") == "Status"
        and status.get("reason") == "NotFound"
        and isinstance(details, dict)
        and details.get("name") == target.name
        and details.get("kind") == target.kind[1]
        and details.get("group", "") == target.kind[0]
    )


def _is(reply: Mapping[str, Any], target: _Object) -> bool:
    """The answer is the object asked about (its name and namespace), not another one."""
    metadata = reply.get("metadata")
    return (
        isinstance(metadata, dict)
        and metadata.get("name") == target.name
        and (target.namespace is None or metadata.get("namespace") == target.namespace)
    )


def _deployment(args: Mapping[str, Any]) -> _Object | None:
    namespace, deployment = args.get("namespace", "default"), args.get("deployment")
    if not _is_name(namespace) or not _is_name(deployment):
        return None
    path = f"/apis/apps/v1/namespaces/{_segment(namespace)}/deployments/{_segment(deployment)}"
    return _Object(path, DEPLOYMENTS, deployment, namespace)


def _is_name(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and value not in ("", ".", "..")


def _segment(value: Any) -> str:
    return quote(str(value), safe="")
