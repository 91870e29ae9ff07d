"""Opening a store read-only (``create=False``): nothing is ever created or written."""

from __future__ import annotations

import os
import sqlite3
import uuid

import pytest

import eventlanes as el

E = el.NewEvent


def test_read_only_open_of_a_missing_sqlite_file_creates_nothing(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/missing.db"
    with pytest.raises(el.StoreConnectionError, match="missing.db.*does not exist"):
        el.open_store(url, create=False)
    assert os.listdir(tmp_path) == []


def test_read_only_open_of_a_file_without_the_table_names_it(tmp_path) -> None:
    path = tmp_path / "other.db"
    sqlite3.connect(path).close()  # an empty database: no eventlanes tables
    size = path.stat().st_size
    with pytest.raises(el.StoreConnectionError, match=r"other\.db.*no table 'el_events'"):
        el.open_store(f"sqlite:///{path}", create=False)
    assert path.stat().st_size == size
    assert sqlite3.connect(path).execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)


def test_read_only_open_of_a_missing_postgres_table_or_database(pg_url: str) -> None:
    url = f"{pg_url}?prefix=never_created_"
    with pytest.raises(el.StoreConnectionError, match="no (table|sequence) 'never_created_events"):
        el.open_store(url, create=False)
    import psycopg

    with psycopg.connect(pg_url) as conn:
        sql = "SELECT count(*) FROM pg_class WHERE relname LIKE 'never_created_%'"
        assert conn.execute(sql).fetchone() == (0,)
    base, _, _ = pg_url.rpartition("/")
    with pytest.raises(el.StoreConnectionError, match="no_such_db"):
        el.open_store(f"{base}/no_such_db", create=False)


def test_read_only_store_reads_and_never_writes(store_url: str) -> None:
    with el.open_store(store_url) as writer:
        writer.append("a", [E("A", {"n": 1}), E("B")])
        with el.open_store(store_url, create=False) as reader:
            assert [e.type for e in reader.read()] == ["A", "B"]
            assert reader.head() == 2 and reader.count() == 2
            assert reader.read_stream("a")[0].data == {"n": 1}
            writer.append("a", [E("C")])  # a writer next to it is seen
            assert reader.head() == 3
            with pytest.raises(el.StoreConnectionError, match="read-only"):
                reader.append("a", [E("D")])
        assert writer.count() == 3


def test_a_closed_postgres_store_leaves_no_connection_or_thread_behind(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An app that opens a store, appends and closes it again, many times over, must not keep
    a connection per store open: the notifying thread's connection used to outlive the store,
    and a few hundred such stores used up the server's max_connections. Only the stores'
    connections are counted (libpq names them from ``PGAPPNAME``): the server also serves
    what earlier tests of this worker started, which may still be connecting or leaving."""
    import threading
    import time

    import psycopg

    mine = f"closed-stores-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("PGAPPNAME", mine)

    def connections() -> int:
        with psycopg.connect(pg_url, autocommit=True, application_name="counting") as conn:
            sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            return conn.execute(sql, (mine,)).fetchone()[0]  # type: ignore[index]

    def notifiers() -> int:
        return sum(t.name == "eventlanes-notify" and t.is_alive() for t in threading.enumerate())

    before, threads = connections(), notifiers()
    assert before == 0
    kept = []  # referenced to the end: what a closed store leaks is not freed by the collector
    for i in range(5):
        store = el.open_store(f"{pg_url}?prefix=closed_{os.getpid()}_{i}_")
        kept.append(store)
        store.append("s", [el.NewEvent("E", {"i": i})])
        if i == 0:
            assert connections() > 0  # the stores' connections are the ones counted
        store.close()
    deadline = time.monotonic() + 10
    while (connections(), notifiers()) != (before, threads) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (connections(), notifiers()) == (before, threads)
