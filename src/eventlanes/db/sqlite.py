"""SQLite backend: one file, WAL mode, one connection per thread (and per process)."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from ..errors import (
    DatabaseUnavailableError,
    EventlanesError,
    InvalidInputError,
    StoreConnectionError,
)
from .base import Database, first_line
from .url import DatabaseURL

_SYNC_LEVELS = {"off", "normal", "full", "extra"}
# Primary result codes that a later retry may cure: BUSY, LOCKED, NOMEM, IOERR, FULL, CANTOPEN,
# PROTOCOL (https://sqlite.org/rescode.html).
#: SQLite primary result codes that pass: BUSY, LOCKED, NOMEM, IOERR, FULL, CANTOPEN, PROTOCOL
TRANSIENT = frozenset({5, 6, 7, 10, 13, 14, 15})
_READONLY = 8
#: how a busy timeout passing is told: another connection holds the write lock (another
#: worker's batch), not an outage
LOCK_WAIT = "waiting for another writer's lock on"


class SQLiteDatabase(Database):
    backend = "sqlite"
    param = "?"
    now_ms = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"

    def __init__(self, url: DatabaseURL, create: bool = True) -> None:
        super().__init__(url, create)
        self.path = url.target  # never ":memory:" (refused by parse_url)
        sync = url.options.get("synchronous", "normal").lower()
        if sync not in _SYNC_LEVELS:
            raise InvalidInputError(
                f"invalid synchronous={sync!r}: use one of {sorted(_SYNC_LEVELS)}"
            )
        self._synchronous = sync
        try:
            self.busy_ms = int(url.options.get("busy_timeout", "60000"))
        except ValueError as exc:
            raise InvalidInputError(f"invalid busy_timeout in {url.url!r}: {exc}") from exc
        if not 0 <= self.busy_ms <= 2**31 - 1:  # SQLite takes a C int; below 0 it never waits
            raise InvalidInputError(
                f"invalid busy_timeout={self.busy_ms} in {url.url!r}: milliseconds to wait for "
                "a lock, >= 0 and < 2**31"
            )
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        # Fail fast with a clear error when the file cannot be opened.
        self._conn()

    def _conn(self) -> sqlite3.Connection:
        local = self._local
        conn = getattr(local, "conn", None)
        # A forked child must not reuse its parent's connection.
        if conn is not None and local.pid == os.getpid():
            return conn
        try:
            path = Path(self.path).expanduser().resolve()
            if not path.parent.is_dir():
                raise StoreConnectionError(
                    f"cannot open SQLite store {self.url.url!r}: "
                    f"directory {str(path.parent)!r} does not exist"
                )
            if not self.create and not path.is_file():
                raise StoreConnectionError(
                    f"cannot open SQLite store {self.url.url!r} read-only (create=False): "
                    f"file {str(path)!r} does not exist"
                )
            read_only_fs = self._read_only_fs(path)
            if self.create and read_only_fs:
                raise StoreConnectionError(
                    f"cannot open SQLite store {self.url.url!r} for writing: the file system "
                    "is read-only (open_store(url, create=False) reads it)"
                )
            # mode=ro: SQLite itself refuses every write (and never creates the file). On a
            # read-only file system nobody can change the file, and SQLite could not create
            # the WAL index it needs: immutable.
            uri = self.read_only_uri()
            conn = sqlite3.connect(
                uri if not self.create else self.path,
                isolation_level=None,
                check_same_thread=False,
                timeout=self.busy_ms / 1000,
                uri=not self.create,
            )
            conn.execute(f"PRAGMA busy_timeout = {self.busy_ms}")
            if self.create:
                # Setting the journal mode writes the header: only when we may write.
                mode = _journal_mode_wal(conn, self.busy_ms / 1000)
                if mode.lower() != "wal":
                    raise StoreConnectionError(
                        f"cannot open SQLite store {self.url.url!r}: "
                        f"WAL mode unavailable (got {mode!r})"
                    )
            else:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # a database?
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        except sqlite3.DatabaseError as exc:
            raise StoreConnectionError(f"cannot open SQLite store {self.url.url!r}: {exc}") from exc
        local.conn = conn
        local.pid = os.getpid()
        with self._lock:
            self._all.append(conn)
        return conn

    @staticmethod
    def _read_only_fs(path: Path) -> bool:
        return bool(os.statvfs(path.parent).f_flag & os.ST_RDONLY)

    def read_only_uri(self) -> str:
        """The file as a URI that SQLite opens read-only (``mode=ro``: it refuses every write
        and never creates the file); on a read-only file system ``immutable=1`` too."""
        path = Path(self.path).expanduser().resolve()
        return f"file:{quote(str(path))}?mode=ro" + (
            "&immutable=1" if self._read_only_fs(path) else ""
        )

    @contextmanager
    def transaction(self, pipeline: bool = False) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        # IMMEDIATE takes the write lock up front: a deferred transaction that upgrades to a
        # writer fails at once with SQLITE_BUSY instead of waiting.
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        else:
            try:
                conn.execute("COMMIT")
            except BaseException:
                # A failed COMMIT (disk full, I/O error) can leave the transaction open: end
                # it, or every later BEGIN on this thread's connection would fail.
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    @contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        yield self._conn()

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every statement inside sees the same committed state."""
        conn = self._conn()
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")

    def translate(self, exc: BaseException, operation: str) -> EventlanesError | None:
        if not isinstance(exc, sqlite3.Error):
            return None
        code = getattr(exc, "sqlite_errorcode", None)
        primary = None if code is None else code & 0xFF
        cause = f"{first_line(exc)} (SQLite store {self.url.url!r})"
        if primary in (5, 6):  # BUSY, LOCKED: past busy_timeout
            cause = (
                f"{LOCK_WAIT} {self.path} for more than {self.busy_ms / 1000:g} s "
                f"(busy_timeout; SQLite: {first_line(exc)})"
            )
        if primary in TRANSIENT:
            return DatabaseUnavailableError(operation, cause)
        if primary == _READONLY:
            return StoreConnectionError(f"{operation} failed: the store is read-only: {cause}")
        return StoreConnectionError(f"{operation} failed: {cause}")

    def _exists(self, kind: str, name: str) -> bool:
        if kind != "table":  # SQLite has no sequences or stored functions
            return True
        sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
        return self._conn().execute(sql, (name,)).fetchone() is not None

    @contextmanager
    def ddl_transaction(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        if conn.in_transaction:  # first use of a component inside this thread's transaction
            yield conn
            return
        with self.transaction() as conn:
            yield conn

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()


def _journal_mode_wal(conn: sqlite3.Connection, timeout: float) -> str:
    """``PRAGMA journal_mode = WAL``, waiting up to ``timeout`` seconds for the lock it needs:
    on a new file that other processes open at the same moment, SQLite answers "database is
    locked" at once, without calling its busy handler (seen with four processes opening one
    new store)."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            return conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
