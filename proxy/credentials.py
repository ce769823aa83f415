"""The cluster credential the sidecar holds for its agent.

The shipped pod mounts the service-account token into the sidecar alone, so an agent cannot
carry it off and use it from elsewhere. A request that the proxy recognised as a Kubernetes
upstream with ``token_file`` and that carries no ``Authorization`` of its own is sent with that
token. Nothing else ever gets it: a request to any other destination (an alias the proxy did
not recognise included) leaves without a credential, and the API server refuses it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, MutableMapping, Sequence
from pathlib import Path

from .config import Upstream

log = logging.getLogger(__name__)
TOKEN_TTL = 60.0  # seconds: projected tokens are rotated in place, so the file is read again


class UpstreamTokens:
    """Bearer tokens read from the ``token_file`` of Kubernetes upstreams, cached briefly."""

    def __init__(
        self,
        upstreams: Sequence[Upstream],
        *,
        clock: Callable[[], float] = time.monotonic,
        ttl: float = TOKEN_TTL,
    ) -> None:
        self.files = {
            u.name: Path(u.token_file)
            for u in upstreams
            if u.profile == "kubernetes" and u.token_file
        }
        self.clock, self.ttl = clock, ttl
        self.cache: dict[str, tuple[float, str | None]] = {}  # name -> (read at, token)

    def token(self, upstream: Upstream) -> str | None:
        path = self.files.get(upstream.name)
        if path is None:
            return None
        now = self.clock()
        cached = self.cache.get(upstream.name)
        if cached is not None and now - cached[0] < self.ttl:
            return cached[1]
        try:
            token: str | None = path.read_text().strip() or None
        except OSError as exc:
            # The remote will refuse the request (401): that is the honest answer.
            log.warning("upstreams.%s.token_file: cannot read %s: %s", upstream.name, path, exc)
            token = None
        self.cache[upstream.name] = (now, token)
        return token

    def apply(self, headers: MutableMapping[str, str], upstream: Upstream) -> None:
        """Give a request to ``upstream`` the sidecar's token, unless it brings its own."""
        if "authorization" in headers:
            return
        token = self.token(upstream)
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
