"""What to look up at the remote before settling an ambiguous effect by hand. Pure."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def check_the_remote(
    action: str,
    arguments: Mapping[str, Any],
    *,
    idempotency_key: str | None = None,
    upstream: str | None = None,
) -> str:
    """One or two sentences naming the object or request that says whether it happened."""
    where = f" (upstream {upstream})" if upstream else ""
    if action.startswith("stripe."):
        return _stripe(action, arguments, idempotency_key, where)
    if action.startswith("k8s."):
        return _kubernetes(action, arguments, where)
    shown = json.dumps(dict(arguments), sort_keys=True)
    return (
        f"Ask the system that {action} acts on{where} whether it was done with {shown}; "
        "committed if it was, failed if it certainly was not."
    )


def _stripe(action: str, args: Mapping[str, Any], key: str | None, where: str) -> str:
    # "self" is the platform's own account (ctrlrun's Stripe profile): nothing to name.
    acct = args.get("account")
    account = f" in account {acct}" if acct and acct != "self" else ""
    request = (
        f"the request with Idempotency-Key {key}"
        if key
        else "the request at the time of the attempt"
    )
    first = f"At Stripe{where}{account}: look for {request} in the Dashboard's request logs"
    if action == "stripe.refund":
        payment = args.get("payment_intent") or args.get("charge") or args.get("payment_id")
        field = (
            "charge"
            if args.get("charge") and not args.get("payment_intent")
            else ("payment_intent")
        )
        amount = f" of {args['amount']}" if args.get("amount") is not None else ""
        return (
            f"{first}, and for a refund{amount} of {payment} "
            f"(GET /v1/refunds?{field}={payment}). Committed if it exists."
        )
    if action == "stripe.cancel_payment_intent":
        pi = args.get("payment_intent")
        return f"{first}, and whether {pi} is canceled (GET /v1/payment_intents/{pi})."
    return f"{first} (GET /v1/events). Committed if Stripe applied it."


def _kubernetes(action: str, args: Mapping[str, Any], where: str) -> str:
    cluster = f" in cluster {args['cluster']}" if args.get("cluster") else ""
    ns = args.get("namespace", "default")
    if action == "k8s.scale":
        # A StatefulSet or ReplicaSet is scaled too: ``workload`` names its kind.
        kind, _, name = str(args.get("workload") or "").partition("/")
        if not name:
            kind, name = "deployment", args.get("deployment") or "?"
        return (
            f"In Kubernetes{cluster}{where}: kubectl -n {ns} get {kind} {name} "
            f"-o jsonpath='{{.spec.replicas}}'. Committed if it is {args.get('replicas')}."
        )
    if action == "k8s.delete_namespace":
        return (
            f"In Kubernetes{cluster}{where}: kubectl get namespace {args.get('name')}. "
            "Committed if it is gone or Terminating."
        )
    if action == "k8s.delete_deployment":
        return (
            f"In Kubernetes{cluster}{where}: kubectl -n {ns} get deployment "
            f"{args.get('deployment')}. Committed if it is gone or being deleted."
        )
    workload = args.get("workload") or args.get("deployment") or "the object"
    changes = ", ".join(map(str, args.get("changes") or [])) or "see the arguments"
    return (
        f"In Kubernetes{cluster}{where}: kubectl -n {ns} get {workload} -o yaml, and compare "
        f"it with the change ({changes})."
    )
