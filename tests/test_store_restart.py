"""PostgreSQL restarts: a server of its own (the session's shared server is not disturbed) is
stopped with ``pg_ctl stop -m immediate`` and started again on the same port. The same open
store reports the outage as DatabaseUnavailableError within its pool timeout and works again
by itself once the server is back."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import eventlanes as el
from eventlanes.errors import DatabaseUnavailableError

E = el.NewEvent
POOL_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def server() -> Iterator[object]:
    from eventlanes.testing.postgres import EmbeddedPostgres

    pg = EmbeddedPostgres(fsync=False, max_connections=50)
    try:
        yield pg
    finally:
        pg.stop()


def _until_available(call, limit: float = 20.0):
    deadline = time.monotonic() + limit
    while True:
        try:
            return call()
        except DatabaseUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.parametrize("mode", ["immediate", "fast"])
def test_same_store_survives_a_restart(server, mode: str) -> None:
    url = f"{server.url}?prefix=r_{mode}_&pool_min=2&pool_max=4&pool_timeout={POOL_TIMEOUT}"
    store = el.open_store(url)
    store.append("s", [E("A"), E("B")])
    assert store.head() == 2
    server.halt(mode)
    try:
        for call, operation in [
            (store.head, "head"),
            (lambda: store.append("s", [E("C")]), "append to stream 's'"),
            (lambda: store.read(after=1), "read after position 1"),
        ]:
            start = time.monotonic()
            with pytest.raises(DatabaseUnavailableError) as info:
                call()
            assert time.monotonic() - start < POOL_TIMEOUT + 2
            assert info.value.operation == operation
            assert operation in str(info.value) and "\n" not in str(info.value)
            assert info.value.__cause__ is not None
    finally:
        server.start()
    restarted = time.monotonic()
    # No reopening: the pool replaces its dead connections by itself.
    assert _until_available(store.head) == 2
    assert time.monotonic() - restarted < POOL_TIMEOUT + 3
    # (After a crash PostgreSQL skips the sequence values it had pre-allocated: a gap.)
    [position] = store.append("s", [E("C")], expected_version=2)
    assert [e.type for e in store.read()] == ["A", "B", "C"]
    # Stale connections are checked at checkout: the first calls after a restart succeed.
    server.restart(mode)
    assert store.head() == position
    assert store.stream_version("s") == 3
    store.close()


def test_pool_timeout_is_validated(server) -> None:
    for bad in ("0", "-1", "soon"):
        with pytest.raises(el.InvalidInputError, match="pool_timeout"):
            el.open_store(f"{server.url}?pool_timeout={bad}")
