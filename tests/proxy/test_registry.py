"""Each upstream gets the reconciler of its profile, built from a target of its own values."""

from __future__ import annotations

from ctrlrun.proxy import registry
from ctrlrun.proxy.config_parse import policy_from_yaml, proxy_config
from ctrlrun.reconcilers import (
    Check,
    DeclarativeReconciler,
    DeclarativeTarget,
    KubernetesReconciler,
    KubernetesTarget,
    StripeReconciler,
    StripeTarget,
)

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  billing.send: {decision: allow}
  billing.void: {decision: allow}
upstreams:
  stripe:
    profile: stripe
    url: https://api.stripe.com
    api_key_env: STRIPE_KEY
    ca_file: /ca.pem
    timeout: 90
  eu:
    profile: kubernetes
    url: https://10.0.0.1:6443
    token_file: /token
  quiet:
    profile: kubernetes
    url: https://10.0.0.2:6443
    reconcile: off
  billing:
    profile: http
    url: http://billing.test:8000
    routes:
      - method: POST
        path: /v1/invoices/{id}/send
        action: billing.send
        reconcile: {get: "/v1/invoices/{id}", committed: {status: sent}, not_executed: {a: 1}}
      - {method: DELETE, path: "/v1/invoices/{id}", action: billing.void}
  plain:
    profile: http
    url: http://plain.test
    routes:
      - {method: DELETE, path: "/v1/invoices/{id}", action: billing.void}
"""


def test_targets_carry_the_upstreams_values() -> None:
    ups = proxy_config(policy_from_yaml(POLICY)).upstreams
    stripe, eu, _quiet, billing, plain = ups
    assert registry.stripe_target(stripe) == StripeTarget(
        "https://api.stripe.com", api_key_env="STRIPE_KEY", ca_file="/ca.pem", timeout=90.0
    )
    assert registry.kubernetes_target(eu) == KubernetesTarget(
        "https://10.0.0.1:6443", token_file="/token"
    )
    check = Check("/v1/invoices/{id}", {"status": "sent"}, {"a": 1})
    assert registry.declarative_target(billing) == DeclarativeTarget(
        "http://billing.test:8000", (("billing.send", check),)
    )
    assert registry.declarative_target(plain).checks == ()


def test_build_gives_each_upstream_its_profiles_reconciler() -> None:
    built = registry.build(proxy_config(policy_from_yaml(POLICY)).upstreams)
    assert set(built) == {"stripe", "eu", "quiet", "billing", "plain"}
    stripe = built["stripe"]
    assert isinstance(stripe, StripeReconciler)
    assert stripe.write_timeout == 90.0 and stripe.ca_file == "/ca.pem"
    assert isinstance(built["eu"], KubernetesReconciler)
    assert built["eu"].token_file == "/token"
    assert built["quiet"] is None  # reconcile: off
    assert isinstance(built["billing"], DeclarativeReconciler)
    assert built["plain"] is None  # no route declares reconcile:
