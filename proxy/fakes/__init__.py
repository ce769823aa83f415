"""Fake Stripe and Kubernetes API servers: real HTTP servers on loopback, for demos and tests.

with FakeStripe() as stripe_fake:
    pi = stripe_fake.add_payment_intent(amount=5000)
    stripe_fake.fail_next("commit_then_drop")
    ...  # point a client at stripe_fake.url
"""

from __future__ import annotations

from .failures import ReadMode, WriteMode
from .kubernetes import FakeKubernetes
from .server import FakeServer
from .stripe import FakeStripe

__all__ = ["FakeKubernetes", "FakeServer", "FakeStripe", "ReadMode", "WriteMode"]
