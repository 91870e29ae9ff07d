"""Database faults reach users as eventlanes errors naming the operation, never raw driver
errors; the store works again when the fault is gone."""

from __future__ import annotations

import sqlite3

import pytest

import eventlanes as el
from eventlanes.errors import DatabaseUnavailableError

E = el.NewEvent


def test_sqlite_locked_past_the_busy_timeout_is_unavailable_and_then_works(tmp_path) -> None:
    path = tmp_path / "events.db"
    store = el.open_store(f"sqlite:///{path}?busy_timeout=100")
    store.append("x", [E("A")])
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # holds the write lock past our busy timeout
    with pytest.raises(DatabaseUnavailableError, match=r"append to stream 'x'.*locked") as info:
        store.append("x", [E("B")])
    assert info.value.operation == "append to stream 'x'"
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    assert isinstance(info.value, el.StoreConnectionError)
    assert store.head() == 1  # readers are not blocked in WAL mode
    other.execute("ROLLBACK")
    assert store.append("x", [E("B")], expected_version=1) == [2]
    store.close()
