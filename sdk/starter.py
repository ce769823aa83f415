"""The policy ``ctrlrun init`` writes: a starting point that denies what it does not name."""

STARTER_POLICY = """\
# ctrlrun policy. Anything not listed under actions: is denied.
# Check it with: ctrlrun policy check ctrlrun.yaml
schema: ctrlrun.policy/v2

# mode: observe        # run everything, record what would have been refused

actions:
  stripe.refund:
    effect: "refund:{account}:{payment_id}"  # one refund per payment of each account
    rules:
      - when: {amount_lte: 10000}     # up to 100.00 in minor units: allowed
        decision: allow
      - when: {amount_gt: 10000}      # larger refunds need a human: ctrlrun approve apr_...
        decision: approve
  stripe.cancel_payment_intent:
    effect: "cancel:{account}:{payment_intent}"
    decision: allow
  k8s.scale:                          # any write that changes replicas, as the apiserver applies it
    effect: "scale:{cluster}:{namespace}:{workload}:{replicas}"
    window: 10m                       # the same scale may be asked again after 10 minutes
    rules:
      - when: {replicas_lte: 20}
        decision: allow
      # no match: denied
  k8s.update_deployment:              # kubectl apply, set image, rollout restart: other changes
    effect: "update:{cluster}:{namespace}:{workload}:{revision}"
    decision: allow
  k8s.update_statefulset:
    effect: "update:{cluster}:{namespace}:{workload}:{revision}"
    decision: allow
  k8s.delete_namespace:
    effect: "delete-ns:{cluster}:{name}"
    decision: deny
  # A shell, an attach or a tunnel into a pod can change anything, and nothing records what.
  k8s.exec: {decision: deny}          # kubectl exec (args: cluster namespace pod container command)
  k8s.attach: {decision: deny}        # kubectl attach
  k8s.port_forward: {decision: deny}  # kubectl port-forward (args: ... pod ports)

# Where else the agent may go through the sidecar. Upstreams are always guarded, whatever
# name or address the agent uses for them; any other host not listed here is refused.
egress:
  default: deny
  allow:
    - api.openai.com
    - api.anthropic.com
    - generativelanguage.googleapis.com
    - "*.openai.azure.com"
    - api.mistral.ai

# The sidecar proxy forwards protected requests to these upstreams.
upstreams:
  stripe:
    profile: stripe
    url: https://api.stripe.com
    # listen: 127.0.0.1:8101          # reverse listener: point the agent's API base here
    # api_key_env: STRIPE_API_KEY     # lets the reconciler ask Stripe what happened
  cluster:
    profile: kubernetes
    url: https://kubernetes.default.svc:443
    cluster: prod-eu
    # ca_file: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
    # token_file: /var/run/secrets/kubernetes.io/serviceaccount/token
"""
