"""Database faults reach users as eventlanes errors naming the operation, never raw driver
errors; the store works again when the fault is gone."""

from __future__ import annotations

import sqlite3

import pytest

import eventlanes as el
from eventlanes.errors import DatabaseUnavailableError
from tests.conftest import mounted_tmpfs

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


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MB tmpfs of its own."""
    with mounted_tmpfs(tmp_path / "disk", "2m") as mount:
        yield mount


def _fill(path) -> None:
    import os

    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass  # no space left: what we wanted
    finally:
        os.close(fd)


def test_sqlite_disk_full_is_unavailable_and_recovers_with_the_same_store(small_disk) -> None:
    store = el.open_store(f"sqlite:///{small_disk}/events.db")
    written = len(store.append("s", [E("Warm", {"i": i}) for i in range(10)]))
    filler = small_disk / "filler"
    _fill(filler)
    batch = [E("Big", {"pad": "x" * 4000, "i": i}) for i in range(50)]
    with pytest.raises(DatabaseUnavailableError, match=r"append to stream 's'.*full") as info:
        for _ in range(100):  # the WAL may still have room for a few
            written += len(store.append("s", batch))
    assert info.value.operation == "append to stream 's'"
    check = sqlite3.connect(small_disk / "events.db")
    assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    check.close()
    # Nothing half-written: every event the store holds came from a successful append.
    assert store.count() == written == store.head()
    filler.unlink()
    assert len(store.append("s", batch, expected_version=written)) == 50
    events = list(store.iter_events())
    assert len(events) == written + 50
    assert [e.version for e in events] == list(range(1, written + 51))
    store.close()


def test_sqlite_file_on_a_read_only_filesystem_gives_a_clear_error(small_disk) -> None:
    import subprocess

    url = f"sqlite:///{small_disk}/events.db"
    with el.open_store(url) as store:
        store.append("s", [E("A")])
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    with el.open_store(url, create=False) as reader:
        assert [e.type for e in reader.read()] == ["A"]
    with pytest.raises(el.StoreConnectionError, match="read-only|readonly") as info:
        el.open_store(url).append("s", [E("B")])
    assert not isinstance(info.value, DatabaseUnavailableError)
    assert "sqlite3" not in type(info.value).__module__
