"""The ``upstreams:`` and ``agents:`` sections of a policy file, parsed into frozen values.

The proxy hands these sections to the policy loader (``load_policy``, ``policy_from_yaml``)
and reads them back with ``proxy_config``; a process that loads the policy without them
(the SDK) leaves them unparsed. Every key set is closed and every error names file, line and
key (see ``yamlstrict.Where``). Upstream hosts are stored lower case and, for IPv6 literals,
without brackets; ``url`` is ``scheme://host[:port]`` with the default port (443, 80) left out.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Collection
from typing import Any, cast
from urllib.parse import urlsplit

from ctrlrun.config import policy_path
from ctrlrun.policy import Policy
from ctrlrun.policy_sections import Section, SectionContext
from ctrlrun.templates import TemplateSyntaxError, parse_template
from ctrlrun.yamlstrict import (
    Where,
    YamlList,
    YamlMap,
    check_keys,
    check_plain,
    expect_choice,
    expect_map,
    expect_str,
    plain,
    show,
)

from .config import (
    AgentCredential,
    Profile,
    ProxyConfig,
    ReconcileMode,
    Route,
    RouteReconcile,
    Upstream,
)
from .egress import Egress, parse_egress
from .kube_proxies import route_path_error
from .limits import Limits, parse_limits
from .mcp_config import MCP_PROFILES, STRIPE_API, McpSettings, parse_mcp
from .notify import NOTIFY
from .route_values import WRITE_METHODS

PROFILES = ("stripe", "kubernetes", "http", *MCP_PROFILES)
# Upstream keys that every profile takes; PROFILE_ONLY adds the rest.
COMMON_KEYS = ("profile", "url", "listen", "ca_file", "timeout", "reconcile", "unmapped_writes")
# Keys that only one profile understands: anywhere else they would be silently ignored.
PROFILE_ONLY: dict[str, tuple[str, ...]] = {
    "cluster": ("kubernetes",),
    "token_file": ("kubernetes",),
    "api_key_env": ("stripe", "stripe-mcp"),
    "routes": ("http", "kubernetes"),
    "tools": MCP_PROFILES,
    "unmapped_tools": MCP_PROFILES,
    "refuse_methods": MCP_PROFILES,
    "api_url": ("stripe-mcp",),
}
ROUTE_KEYS = frozenset({"method", "path", "action", "reconcile"})
ROUTE_RECONCILE_KEYS = ("get", "committed", "not_executed")
RECONCILE_MODES = ("eager", "lazy", "off")
UPSTREAM_KEYS = frozenset(COMMON_KEYS) | PROFILE_ONLY.keys()
DEFAULT_PORTS = {"https": 443, "http": 80}
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})
_HOSTNAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\.?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PORT = re.compile(r"[0-9]{1,5}")
_PLACEHOLDER = re.compile(r"\{[^{}]*\}")


def parse_upstreams(value: Any, where: Where, actions: Collection[str]) -> tuple[Upstream, ...]:
    entries = expect_map(value, where)
    result: list[Upstream] = []
    origins: dict[tuple[str, str, int], str] = {}
    listeners: dict[tuple[str, int], str] = {}
    for name, entry in entries.items():
        at = where.key(entries, name)
        if not isinstance(name, str) or not name:
            raise at.error(f"an upstream name must be a non-empty string, got {show(name)}")
        upstream = _upstream(name, entry, at, actions)
        origin = (upstream.scheme, upstream.host, upstream.port)
        if origin in origins:
            raise at.key(entry, "url").error(
                f"{upstream.url} is already the url of upstream {origins[origin]!r}"
            )
        origins[origin] = name
        if upstream.listen is not None:
            for (host, port), other in listeners.items():
                if port == upstream.listen[1] and (
                    host == upstream.listen[0] or {host, upstream.listen[0]} & WILDCARD_HOSTS
                ):
                    raise at.key(entry, "listen").error(
                        f"port {port} is already a listen address of upstream {other!r}"
                    )
            listeners[upstream.listen] = name
        result.append(upstream)
    return tuple(result)


def _upstream(name: str, value: Any, where: Where, actions: Collection[str]) -> Upstream:
    entry = expect_map(value, where)
    check_keys(entry, where, UPSTREAM_KEYS, required=("profile", "url"))

    def at(key: str) -> Where:
        return where.key(entry, key)

    profile = cast(Profile, expect_choice(entry["profile"], at("profile"), PROFILES))
    for key, only in PROFILE_ONLY.items():
        if key in entry and profile not in only:
            raise at(key).error(
                f"only a 'profile: {' or '.join(only)}' upstream takes this key, not {profile}"
            )
    scheme, host, port, url = parse_url(entry["url"], at("url"))
    listen = parse_listen(entry["listen"], at("listen")) if "listen" in entry else None
    cluster = expect_str(entry["cluster"], at("cluster")) if "cluster" in entry else None
    if profile == "kubernetes" and cluster is None:
        cluster = name
    timeout = 30
    if "timeout" in entry:
        timeout = entry["timeout"]
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0:
            raise at("timeout").error(
                f"must be a positive integer number of seconds, got {show(timeout)}"
            )
    reconcile = expect_choice(entry.get("reconcile", "eager"), at("reconcile"), RECONCILE_MODES)
    routes: tuple[Route, ...] = ()
    if "routes" in entry:
        routes = parse_routes(entry["routes"], at("routes"), actions, profile == "kubernetes")
    unmapped = expect_choice(
        entry.get("unmapped_writes", "deny"), at("unmapped_writes"), ("deny", "allow")
    )
    return Upstream(
        name=name,
        profile=profile,
        url=url,
        scheme=scheme,
        host=host,
        port=port,
        listen=listen,
        cluster=cluster,
        ca_file=expect_str(entry["ca_file"], at("ca_file")) if "ca_file" in entry else None,
        token_file=(
            expect_str(entry["token_file"], at("token_file")) if "token_file" in entry else None
        ),
        api_key_env=env_name(entry["api_key_env"], at("api_key_env"))
        if "api_key_env" in entry
        else None,
        timeout=float(timeout),
        reconcile=cast(ReconcileMode, reconcile),
        routes=routes,
        unmapped_writes="allow" if unmapped == "allow" else "deny",
        mcp=_mcp(entry, where, profile, actions),
    )


def _mcp(
    entry: YamlMap, where: Where, profile: str, actions: Collection[str]
) -> McpSettings | None:
    if profile not in MCP_PROFILES:
        return None
    api_url = None
    if profile == "stripe-mcp":
        api_url = parse_url(entry.get("api_url", STRIPE_API), where.key(entry, "api_url"))[3]
    return parse_mcp(entry, where, profile, actions, api_url)


def parse_url(value: Any, where: Where) -> tuple[str, str, int, str]:
    """``(scheme, host, port, normalised url)`` of an upstream's ``url:``."""
    text = expect_str(value, where)
    shape = "must be scheme://host[:port] with http or https and no path, query or fragment"
    try:
        parts = urlsplit(text)
        explicit_port = parts.port
    except ValueError as exc:
        raise where.error(f"{shape}: {exc}") from None
    if parts.scheme not in DEFAULT_PORTS:
        raise where.error(f"{shape}, got scheme {parts.scheme!r}")
    if "@" in parts.netloc:
        # Never echo the URL: it would carry the credential into logs.
        raise where.error("must not carry a user or password; use api_key_env or token_file")
    if parts.path not in ("", "/") or "?" in text or "#" in text:
        raise where.error(f"{shape}, got {text!r}")
    host = parts.hostname or ""
    _check_host(host, where, bracketed="[" in parts.netloc)
    if explicit_port == 0:
        raise where.error(f"port must be 1..65535, got {text!r}")
    port = explicit_port or DEFAULT_PORTS[parts.scheme]
    shown = f"[{host}]" if ":" in host else host
    suffix = "" if port == DEFAULT_PORTS[parts.scheme] else f":{port}"
    return parts.scheme, host, port, f"{parts.scheme}://{shown}{suffix}"


def parse_listen(value: Any, where: Where) -> tuple[str, int]:
    """``(host, port)`` of a ``listen: host:port``; an IPv6 host is written in brackets."""
    if not isinstance(value, str):
        raise where.error(f"must be 'host:port', such as '127.0.0.1:8101', got {show(value)}")
    host, colon, port_text = value.rpartition(":")
    if not colon or not host or not _PORT.fullmatch(port_text):
        raise where.error(f"must be 'host:port', such as '127.0.0.1:8101', got {value!r}")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise where.error(f"port must be 1..65535, got {port}")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1].lower() if bracketed else host.lower()
    _check_host(host, where, bracketed=bracketed)
    return host, port


def _check_host(host: str, where: Where, *, bracketed: bool) -> None:
    if not host:
        raise where.error("has no host")
    if bracketed or ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise where.error(f"{host!r} is not an IPv6 address (write it as [::1])") from None
        if not bracketed:
            raise where.error(f"an IPv6 address is written in brackets: [{host}]")
    elif not _HOSTNAME.fullmatch(host):
        raise where.error(f"{host!r} is not a host name or address")


def parse_routes(
    value: Any, where: Where, actions: Collection[str], through_proxy: bool = False
) -> tuple[Route, ...]:
    """An upstream's ``routes:``; ``through_proxy`` for a Kubernetes upstream's, which map
    only requests through the apiserver's proxy (where a GET may act, so it may be routed)."""
    if not isinstance(value, YamlList):
        raise where.error(f"must be a list of routes, got {show(value)}")
    methods = ("GET", "HEAD", *WRITE_METHODS) if through_proxy else WRITE_METHODS
    routes: list[Route] = []
    seen: dict[tuple[str, str], int] = {}
    for i, item in enumerate(value):
        at = where.index(value, i)
        entry = expect_map(item, at)
        check_keys(entry, at, ROUTE_KEYS, required=("method", "path", "action"))
        method = expect_str(entry["method"], at.key(entry, "method")).upper()
        if method not in methods:
            raise at.key(entry, "method").error(
                f"must be one of {', '.join(methods)} (reads pass through), got {entry['method']!r}"
            )
        path = path_template(entry["path"], at.key(entry, "path"))
        if through_proxy:
            _proxy_route(entry, at, path)
        action = expect_str(entry["action"], at.key(entry, "action"))
        if action not in actions:
            raise at.key(entry, "action").error(f"action {action!r} is not declared under actions:")
        shape = (method, _PLACEHOLDER.sub("{}", path))
        if shape in seen:
            raise at.error(f"{method} {path} is already matched by route [{seen[shape]}]")
        seen[shape] = i
        reconcile = None
        if "reconcile" in entry:
            reconcile = _route_reconcile(entry["reconcile"], at.key(entry, "reconcile"))
        routes.append(Route(method=method, path=path, action=action, reconcile=reconcile))
    return tuple(routes)


def _proxy_route(entry: YamlMap, at: Where, path: str) -> None:
    """A Kubernetes upstream's route: a path through the apiserver's proxy, and no
    ``reconcile:`` (the Kubernetes reconciler asks the apiserver, not the workload)."""
    wrong = route_path_error(path)
    if wrong is not None:
        raise at.key(entry, "path").error(wrong)
    if "reconcile" in entry:
        raise at.key(entry, "reconcile").error(
            "a kubernetes upstream's route takes no reconcile: (its reconciler asks the apiserver)"
        )


def _route_reconcile(value: Any, where: Where) -> RouteReconcile:
    entry = expect_map(value, where)
    check_keys(entry, where, ROUTE_RECONCILE_KEYS, required=ROUTE_RECONCILE_KEYS)
    return RouteReconcile(
        get=path_template(entry["get"], where.key(entry, "get")),
        committed=_expectation(entry["committed"], where.key(entry, "committed")),
        not_executed=_expectation(entry["not_executed"], where.key(entry, "not_executed")),
    )


def _expectation(value: Any, where: Where) -> dict[str, Any]:
    """``{dotted.path: value}``; a string value may name an argument as ``{name}``."""
    entry = expect_map(value, where)
    if not entry:
        raise where.error("must name at least one dotted path and its value")
    check_plain(entry, where)
    for key, item in entry.items():
        if not key:
            raise where.key(entry, key).error("a dotted path must not be empty")
        if isinstance(item, str) and ("{" in item or "}" in item):
            try:
                parse_template(item)
            except TemplateSyntaxError as exc:
                raise where.key(entry, key).error(str(exc)) from None
    result: dict[str, Any] = plain(entry)
    return result


def path_template(value: Any, where: Where) -> str:
    """A request path with ``{name}`` placeholders, starting with ``/``, with no query."""
    text = expect_str(value, where)
    if not text.startswith("/") or "?" in text or "#" in text:
        raise where.error(f"must be a path starting with '/', with no query, got {text!r}")
    try:
        parse_template(text)
    except TemplateSyntaxError as exc:
        raise where.error(str(exc)) from None
    return text


def env_name(value: Any, where: Where) -> str:
    """The name of an environment variable (never its value)."""
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        raise where.error(
            f"must be the name of an environment variable (letters, digits, _), got {show(value)}"
        )
    return value


def parse_agents(value: Any, where: Where) -> tuple[AgentCredential, ...]:
    entries = expect_map(value, where)
    result: list[AgentCredential] = []
    owners: dict[str, str] = {}
    for name, entry in entries.items():
        at = where.key(entries, name)
        if not isinstance(name, str) or not name:
            raise at.error(f"an agent name must be a non-empty string, got {show(name)}")
        check_keys(expect_map(entry, at), at, ("token_env",), required=("token_env",))
        token_env = env_name(entry["token_env"], at.key(entry, "token_env"))
        if token_env in owners:
            raise at.key(entry, "token_env").error(
                f"{token_env} already holds the token of agent {owners[token_env]!r}"
            )
        owners[token_env] = name
        result.append(AgentCredential(name=name, token_env=token_env))
    return tuple(result)


def _upstreams_section(value: Any, where: Where, context: SectionContext) -> tuple[Upstream, ...]:
    return parse_upstreams(value, where, context.actions)


def _agents_section(value: Any, where: Where, _: SectionContext) -> tuple[AgentCredential, ...]:
    return parse_agents(value, where)


UPSTREAMS: Section[tuple[Upstream, ...]] = Section("upstreams", _upstreams_section, empty=())
AGENTS: Section[tuple[AgentCredential, ...]] = Section("agents", _agents_section, empty=())
EGRESS: Section[Egress] = Section(
    "egress", lambda value, where, _: parse_egress(value, where), empty=Egress()
)
LIMITS: Section[Limits] = Section(
    "limits", lambda value, where, _: parse_limits(value, where), empty=Limits()
)
# Every section the proxy owns, in the order their errors are reported.
SECTIONS: tuple[Section[Any], ...] = (UPSTREAMS, AGENTS, EGRESS, LIMITS, NOTIFY)


def load_policy(path: str | os.PathLike[str] | None = None) -> Policy:
    """The policy file (explicit path, ``$CTRLRUN_CONFIG``, ``./ctrlrun.yaml``) with the
    proxy's sections parsed."""
    return Policy.from_file(policy_path(path), sections=SECTIONS)


def policy_from_yaml(text: str, *, source: str = "<string>") -> Policy:
    """A policy from YAML text, with the proxy's sections parsed."""
    return Policy.from_yaml(text, source=source, sections=SECTIONS)


def proxy_config(policy: Policy) -> ProxyConfig:
    """The proxy's configuration in ``policy``, which must have been loaded with SECTIONS."""
    return ProxyConfig(
        upstreams=policy.section(UPSTREAMS),
        agents=policy.section(AGENTS),
        egress=policy.section(EGRESS),
        limits=policy.section(LIMITS),
    )
