"""The sidecar's cluster token: only for recognised Kubernetes upstreams, never over the agent's."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrlrun.proxy.config import Upstream
from ctrlrun.proxy.credentials import UpstreamTokens


def upstream(name: str, profile: str = "kubernetes", token_file: str | None = None) -> Upstream:
    return Upstream(
        name=name,
        profile=profile,  # type: ignore[arg-type]
        url="https://10.0.0.1:443",
        scheme="https",
        host="10.0.0.1",
        port=443,
        token_file=token_file,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("sa-token-1\n")
    return path


def test_a_request_without_credentials_gets_the_sidecars_token(token_file: Path) -> None:
    cluster = upstream("cluster", token_file=str(token_file))
    headers: dict[str, str] = {}
    UpstreamTokens([cluster]).apply(headers, cluster)
    assert headers == {"Authorization": "Bearer sa-token-1"}


def test_the_agents_own_credential_is_kept(token_file: Path) -> None:
    cluster = upstream("cluster", token_file=str(token_file))
    headers = {"authorization": "Bearer agent-token"}
    UpstreamTokens([cluster]).apply(headers, cluster)
    assert headers == {"authorization": "Bearer agent-token"}


@pytest.mark.parametrize("profile", ["stripe", "http"])
def test_only_kubernetes_upstreams_get_a_token(token_file: Path, profile: str) -> None:
    other = upstream("other", profile=profile, token_file=str(token_file))
    headers: dict[str, str] = {}
    UpstreamTokens([other]).apply(headers, other)
    assert headers == {}


def test_an_upstream_without_token_file_or_an_unknown_one_gets_nothing(token_file: Path) -> None:
    plain, listed = upstream("plain"), upstream("cluster", token_file=str(token_file))
    tokens = UpstreamTokens([plain, listed])
    for up in (plain, upstream("not-configured", token_file=str(token_file))):
        headers: dict[str, str] = {}
        tokens.apply(headers, up)
        assert headers == {}, up.name


def test_a_rotated_token_is_read_again_after_the_ttl(token_file: Path) -> None:
    cluster, clock = upstream("cluster", token_file=str(token_file)), Clock()
    tokens = UpstreamTokens([cluster], clock=clock, ttl=60)
    assert tokens.token(cluster) == "sa-token-1"
    token_file.write_text("sa-token-2")
    clock.now = 59
    assert tokens.token(cluster) == "sa-token-1"  # cached: no read per request
    clock.now = 60
    assert tokens.token(cluster) == "sa-token-2"


def test_an_unreadable_or_empty_token_file_sends_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = upstream("cluster", token_file=str(tmp_path / "absent"))
    headers: dict[str, str] = {}
    UpstreamTokens([missing]).apply(headers, missing)
    assert headers == {} and "cannot read" in caplog.text
    (tmp_path / "empty").write_text("\n")
    empty = upstream("cluster", token_file=str(tmp_path / "empty"))
    UpstreamTokens([empty]).apply(headers, empty)
    assert headers == {}
