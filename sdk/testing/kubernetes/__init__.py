"""A fake Kubernetes apiserver: objects, patches, cluster state and watches."""

from __future__ import annotations

from .server import FakeKubernetes

__all__ = ["FakeKubernetes"]
