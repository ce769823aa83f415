"""Who is asking: ``--principal`` for a one-agent sidecar, or per-agent proxy credentials."""

from __future__ import annotations

import base64
import binascii
import hmac
import os
from collections.abc import Mapping

from ctrlrun.action import Principal
from ctrlrun.errors import PolicyError

from .config import AgentCredential


class Principals:
    """Resolves the principal of a request from its ``Proxy-Authorization`` header."""

    def __init__(
        self,
        fixed: str | None,
        agents: tuple[AgentCredential, ...],
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self.fixed = Principal(fixed) if fixed else None
        self.tokens: dict[str, bytes] = {}
        for agent in agents:
            token = env.get(agent.token_env)
            if not token:
                raise PolicyError(
                    f"agents.{agent.name}.token_env: environment variable {agent.token_env} is "
                    "not set or empty"
                )
            self.tokens[agent.name] = token.encode("utf-8")

    def resolve(self, proxy_authorization: str | None) -> Principal | None:
        if self.tokens:
            # Listed tokens are the only way in: no credential, or a wrong one, is nobody,
            # even when --principal is also set (a client cannot step around its token).
            who = self._check(proxy_authorization) if proxy_authorization else None
            return Principal(who) if who is not None else None
        return self.fixed

    def _check(self, header: str) -> str | None:
        scheme, _, value = header.strip().partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = (
                base64.b64decode(value.strip(), validate=True).decode().partition(":")
            )
        except (binascii.Error, UnicodeDecodeError):
            return None
        expected = self.tokens.get(user)
        if expected is None or not hmac.compare_digest(expected, password.encode("utf-8")):
            return None
        return user
