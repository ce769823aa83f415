"""Fake remotes for demos and tests: real HTTP servers on loopback (as ``mitmproxy.test`` ships).

with FakeStripe() as stripe_fake:
    pi = stripe_fake.add_payment_intent(amount=5000)
    stripe_fake.fail_next("commit_then_drop")
    ...  # point a client at stripe_fake.url

Each fake counts what it received, applies writes to its own state and can be told to fail
the next requests (``fail_next``, ``fail_reads``, ``delay_next``). ``tls=True`` serves HTTPS
with a certificate from a test CA (``ca_file``); that needs the ``proxy`` extra.
"""

from __future__ import annotations

from .failures import ReadMode, WriteMode
from .kubernetes import FakeKubernetes
from .messages import Request, Response
from .server import FakeServer
from .stripe import FakeStripe

__all__ = [
    "FakeKubernetes",
    "FakeServer",
    "FakeStripe",
    "ReadMode",
    "Request",
    "Response",
    "WriteMode",
]
