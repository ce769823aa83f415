"""The table of MCP sessions the servers assigned, and which DELETEs it lets pass, pure."""

from __future__ import annotations

import pytest

from ctrlrun.proxy.mcp_sessions import Sessions, header
from ctrlrun.proxy.route_values import Request

SID = "3f1c2a9b0d8e4f6a"


def delete(
    path: str = "/mcp",
    session: str | None = SID,
    body: bytes = b"",
    repeated: frozenset[str] = frozenset(),
) -> Request:
    headers = {} if session is None else {"mcp-session-id": session}
    return Request("DELETE", path, headers=headers, body=body, repeated=repeated)


def assigned(*sessions: tuple[str, str, str], limit: int = 10_000) -> Sessions:
    table = Sessions(limit)
    for upstream, path, sid in sessions:
        table.answered(upstream, "POST", path, 200, asked=None, given=sid)
    return table


def test_the_end_of_a_session_the_server_assigned_on_that_path_passes() -> None:
    assert assigned(("m", "/mcp", SID)).refusal("m", delete()) is None


@pytest.mark.parametrize(
    ("request_", "why"),
    [
        (delete("/v1/customers/cus_1"), "did not see the server assign on /v1/customers/cus_1"),
        (delete("/mcp/"), "did not see the server assign on /mcp/"),
        (delete("/MCP"), "did not see the server assign on /MCP"),
        (delete(session="made-up"), "did not see the server assign on /mcp"),
        (delete(session=SID.upper()), "did not see the server assign"),  # ids are exact
        (delete(session=f" {SID}"), "did not see the server assign"),
        (delete(session=""), "did not see the server assign"),
        (delete(session=None), "a DELETE that names no Mcp-Session-Id"),
        (delete(repeated=frozenset({"mcp-session-id"})), "names two Mcp-Session-Ids"),
        (delete(body=b"{}"), "ctrlrun relays no DELETE with a body"),
    ],
)
def test_any_other_delete_is_refused(request_: Request, why: str) -> None:
    got = assigned(("m", "/mcp", SID)).refusal("m", request_)
    assert got is not None and why in got


def test_a_session_belongs_to_one_upstream() -> None:
    table = assigned(("m", "/mcp", SID))
    assert table.refusal("other", delete()) is not None
    assert table.refusal("m", delete()) is None


@pytest.mark.parametrize(
    ("method", "status", "given"),
    [
        ("POST", 404, SID),  # an unknown session's answer
        ("POST", 500, SID),
        ("POST", None, SID),  # no answer
        ("POST", 200, None),
        ("POST", 200, ""),
        ("GET", 200, SID),  # the SSE stream's answer assigns nothing
        ("DELETE", 200, SID),
    ],
)
def test_only_a_2xx_answer_to_a_post_assigns_a_session(
    method: str, status: int | None, given: str | None
) -> None:
    table = Sessions()
    table.answered("m", method, "/mcp", status, asked=None, given=given)
    assert len(table) == 0
    assert table.refusal("m", delete()) is not None


def test_a_session_is_forgotten_once_its_delete_is_answered_2xx() -> None:
    table = assigned(("m", "/mcp", SID), ("m", "/mcp", "other"))
    table.answered("m", "DELETE", "/mcp", 404, asked=SID, given=None)  # not ended: kept
    assert table.refusal("m", delete()) is None
    table.answered("m", "DELETE", "/mcp", 204, asked=SID, given=SID)  # an echo assigns nothing
    assert table.refusal("m", delete()) is not None
    assert table.refusal("m", delete(session="other")) is None
    assert len(table) == 1


def test_a_delete_on_another_path_ends_no_session() -> None:
    table = assigned(("m", "/mcp", SID), ("m", "/other", SID))
    table.answered("m", "DELETE", "/other", 200, asked=SID, given=None)
    assert table.refusal("m", delete("/mcp")) is None
    assert table.refusal("m", delete("/other")) is not None


def test_the_table_is_bounded_and_forgets_the_least_recently_seen() -> None:
    table = assigned(*[("m", "/mcp", f"s{i}") for i in range(5)], limit=3)
    assert len(table) == 3
    assert [table.known("m", "/mcp", f"s{i}") for i in range(5)] == [False, False] + [True] * 3
    # s2 is the least recently seen; a later answer naming it again makes s3 the oldest.
    table.answered("m", "POST", "/mcp", 200, asked=None, given="s2")
    table.assigned("m", "/mcp", "s5")
    assert not table.known("m", "/mcp", "s3")
    assert all(table.known("m", "/mcp", s) for s in ("s2", "s4", "s5"))


def test_the_default_bound_is_ten_thousand() -> None:
    table = assigned(*[("m", "/mcp", f"s{i}") for i in range(10_001)])
    assert len(table) == 10_000
    assert not table.known("m", "/mcp", "s0") and table.known("m", "/mcp", "s10000")


def test_a_header_is_read_as_clients_read_it() -> None:
    pairs = (("Content-Type", "application/json"), ("Mcp-Session-Id", SID))
    assert header(pairs, "mcp-session-id") == SID
    assert header((("mcp-session-id", "a"), ("MCP-SESSION-ID", "b")), "mcp-session-id") == "a, b"
    assert header(pairs[:1], "mcp-session-id") is None
