"""The proxy's configuration: ``upstreams:``, ``agents:`` and ``egress:``, as frozen values.

They sit in the policy file beside ``actions:``; ``config_parse`` parses and validates them
(closed key sets, errors naming file, line and key) when it loads that file for the proxy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .egress import Egress
from .limits import Limits
from .mcp_config import McpSettings

Profile = Literal["stripe", "kubernetes", "http", "mcp", "stripe-mcp"]
ReconcileMode = Literal["eager", "lazy", "off"]


@dataclass(frozen=True)
class RouteReconcile:
    """A declarative reconciler: GET a path, compare dotted JSON paths with values."""

    get: str  # path template, e.g. "/v1/invoices/{invoice_id}"
    committed: dict[str, Any]  # {"status": "sent"}; a value "{name}" means that argument
    not_executed: dict[str, Any]


@dataclass(frozen=True)
class Route:
    """One user route of a ``profile: http`` upstream."""

    method: str  # upper case
    path: str  # path template, e.g. "/v1/invoices/{invoice_id}/send"
    action: str
    reconcile: RouteReconcile | None = None


@dataclass(frozen=True)
class Upstream:
    """One entry of ``upstreams:``."""

    name: str
    profile: Profile
    url: str  # scheme://host[:port], no trailing slash
    scheme: str
    host: str
    port: int
    listen: tuple[str, int] | None = None
    cluster: str | None = None
    ca_file: str | None = None
    token_file: str | None = None
    api_key_env: str | None = None
    timeout: float = 30.0
    reconcile: ReconcileMode = "eager"
    routes: tuple[Route, ...] = ()
    unmapped_writes: Literal["deny", "allow"] = "deny"
    mcp: McpSettings | None = None  # the tools of a profile: mcp or stripe-mcp upstream


@dataclass(frozen=True)
class AgentCredential:
    """A per-agent proxy credential: the token is read from an environment variable."""

    name: str
    token_env: str


@dataclass(frozen=True)
class ProxyConfig:
    """Everything the proxy reads from the policy file."""

    upstreams: tuple[Upstream, ...] = ()
    agents: tuple[AgentCredential, ...] = field(default=())
    egress: Egress = field(default_factory=Egress)
    limits: Limits = field(default_factory=Limits)
