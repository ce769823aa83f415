"""A fake Stripe (v1): its wire conventions, objects, account state and idempotency."""

from __future__ import annotations

from .server import FakeStripe

__all__ = ["FakeStripe"]
