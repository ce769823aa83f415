"""The admin listener over a real socket, and the effect gauges read from a real ledger."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ctrlrun.action import Action, Principal
from ctrlrun.control import Control
from ctrlrun.errors import StoreError
from ctrlrun.policy import Policy
from ctrlrun.proxy import metrics as metrics_module
from ctrlrun.proxy.admin import Admin
from ctrlrun.proxy.metrics import Metrics
from ctrlrun.store import SQLiteStateStore, StateStore

POLICY = "schema: ctrlrun.policy/v2\nactions:\n  a.b:\n    effect: 'k:{n}'\n    decision: allow\n"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStateStore]:
    s = SQLiteStateStore(tmp_path / "state.db")
    yield s
    s.close()


def commit(store: StateStore, n: int) -> None:
    ctl = Control(Policy.from_yaml(POLICY), store)
    attempt = ctl.begin(Action("a.b", {"n": n}, Principal("agent")), f"k:{n}")
    ctl.finish(attempt, "committed")


def ask(admin: Admin, raw: bytes) -> tuple[bytes, bytes]:
    """Send ``raw`` to a live admin listener; the head and the body of its answer."""

    async def main() -> bytes:
        server = await admin.start("127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(raw)
            await writer.drain()
            data = await asyncio.wait_for(reader.read(), 10)  # to EOF: Connection: close
            writer.close()
            return data
        finally:
            server.close()

    head, _, body = asyncio.run(main()).partition(b"\r\n\r\n")
    return head, body


def length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    raise AssertionError(f"no Content-Length in {head!r}")


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/nope"])
def test_head_has_the_headers_of_get_and_no_body(store: SQLiteStateStore, path: str) -> None:
    admin = Admin(lambda: store, Metrics())
    get_head, get_body = ask(admin, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head, body = ask(admin, f"HEAD {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())

    assert get_body and length(get_head) == len(get_body)
    assert head.split(b"\r\n")[0] == get_head.split(b"\r\n")[0]
    assert body == b""  # nothing after the headers: a HEAD answer has no body
    assert length(head) == length(get_head)


def test_get_answers_and_other_methods_are_refused(store: SQLiteStateStore) -> None:
    admin = Admin(lambda: store, Metrics())
    head, body = ask(admin, b"GET /healthz HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and body == b"ok\n"
    head, body = ask(admin, b"POST /healthz HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 405")


def test_readyz_says_when_the_ledger_is_unreachable(store: SQLiteStateStore) -> None:
    class Down:
        def ping(self) -> None:
            raise OSError("no route to the ledger")

    head, body = ask(Admin(lambda: Down(), Metrics()), b"GET /readyz HTTP/1.1\r\n\r\n")  # type: ignore[arg-type, return-value]
    assert head.startswith(b"HTTP/1.1 503") and body == b"ledger unreachable\n"


# -- the effect gauges ----------------------------------------------------------------------


def gauges(text: bytes) -> dict[str, float]:
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    return {s.labels["state"]: s.value for s in families["ctrlrun_effects"].samples}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_effect_counts_are_read_once_per_ttl_however_often_scraped(
    store: SQLiteStateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []
    real = metrics_module.ledger.count_effects

    def counted(conn: Any) -> dict[str, int]:
        reads.append(1)
        return real(conn)

    monkeypatch.setattr(metrics_module.ledger, "count_effects", counted)
    clock = Clock()
    metrics = Metrics(effects_ttl=15.0, clock=clock)
    commit(store, 1)

    assert gauges(metrics.render(store))["committed"] == 1
    commit(store, 2)
    for _ in range(5):  # many scrapers, or one in a loop: no new GROUP BY
        assert gauges(metrics.render(store))["committed"] == 1
    assert len(reads) == 1

    clock.now += 15.0
    assert gauges(metrics.render(store))["committed"] == 2
    assert len(reads) == 2


def test_a_failed_read_keeps_the_last_counts_and_is_counted(store: SQLiteStateStore) -> None:
    clock = Clock()
    metrics = Metrics(effects_ttl=15.0, clock=clock)
    commit(store, 1)
    metrics.render(store)

    class Gone:
        def reading(self) -> Any:
            raise StoreError("the ledger went away")

    clock.now += 15.0
    text = metrics.render(Gone())  # type: ignore[arg-type]

    assert gauges(text)["committed"] == 1  # not a false zero
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    errors = {s.name: s.value for s in families["ctrlrun_store_errors"].samples}
    assert errors["ctrlrun_store_errors_total"] == 1
