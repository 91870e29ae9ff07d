"""PostgreSQL backend: psycopg 3 with a connection pool (created lazily, per process)."""

from __future__ import annotations

import os
import select
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from ..errors import (
    DatabaseUnavailableError,
    EventlanesError,
    InvalidInputError,
    StoreConnectionError,
)
from .base import Database, first_line
from .placeholders import for_psycopg
from .url import DatabaseURL

_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE (psycopg is an optional import)

try:  # PostgreSQL support is an extra: pip install 'eventlanes[postgres]'
    import psycopg
    from psycopg_pool import ConnectionPool
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]
    ConnectionPool = None  # type: ignore[assignment,misc]


#: SQLSTATE classes whose errors no retry cures: the value itself is wrong or too large (data
#: exceptions) or beyond what PostgreSQL stores (program limits: an index row over the page
#: size). (https://www.postgresql.org/docs/current/errcodes-appendix.html)
PERMANENT_CLASSES = frozenset({"22", "54"})


def is_permanent(exc: BaseException) -> bool:
    """Whether a psycopg error is a permanent input error (SQLSTATE class 22 or 54), which
    psycopg files partly under OperationalError (class 54) beside real outages."""
    state = getattr(exc, "sqlstate", None)
    return isinstance(state, str) and state[:2] in PERMANENT_CLASSES


def _check_connection(conn: Any) -> None:
    """The pool's checkout check without a round trip on a healthy connection.

    An idle connection in the pool has nothing to read; a server that stopped or restarted,
    or cut the session, has closed the socket (after a FATAL message): it polls readable. Only
    then is the connection tried for real (an empty query, which raises for a dead one and
    lets the pool replace it). Saves a round trip per transaction and per read."""
    if conn.closed or conn.broken:
        ConnectionPool.check_connection(conn)  # raises: the pool replaces it
        return
    poller = select.poll()
    poller.register(conn.pgconn.socket, select.POLLIN | select.POLLERR | select.POLLHUP)
    if poller.poll(0):
        ConnectionPool.check_connection(conn)


@contextmanager
def pipelined(conn: Any, begin: str = "BEGIN") -> Iterator[Any]:
    """A transaction whose ``begin``, statements and COMMIT are queued in one pipeline: leaving
    it syncs once for all of them. Not psycopg's ``conn.transaction()`` inside a pipeline: it
    syncs on entering (a round trip for BEGIN) and twice on leaving. A failed statement leaves
    the transaction aborted (COMMIT is skipped), an error in the block leaves it open: either
    way it is rolled back before the pool gets the connection back."""
    try:
        with conn.pipeline():
            conn.execute(begin)
            yield conn
            conn.execute("COMMIT")
    except BaseException:
        if not conn.closed and conn.info.transaction_status != _IDLE:
            with suppress(Exception):
                conn.execute("ROLLBACK")
        raise


class PostgresDatabase(Database):
    backend = "postgresql"
    param = "%s"
    now_ms = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
    for_update = " FOR UPDATE"

    def __init__(self, url: DatabaseURL, create: bool = True) -> None:
        super().__init__(url, create)
        if psycopg is None:
            raise StoreConnectionError(
                "PostgreSQL support needs psycopg 3: pip install 'eventlanes[postgres]'"
            )
        try:
            self._pool_min = int(url.options.get("pool_min", "1"))
            self._pool_max = int(url.options.get("pool_max", "8"))
        except ValueError as exc:
            raise InvalidInputError(f"invalid pool size in {url.redacted!r}: {exc}") from exc
        if not 0 <= self._pool_min <= self._pool_max or self._pool_max < 1:
            raise InvalidInputError(
                f"invalid pool sizes in {url.redacted!r}: need 0 <= min <= max, max >= 1"
            )
        try:
            self.pool_timeout = float(url.options.get("pool_timeout", "30"))
        except ValueError:
            self.pool_timeout = -1.0
        if not 0 < self.pool_timeout <= 3600:
            raise InvalidInputError(
                f"invalid pool_timeout={url.options.get('pool_timeout')!r} in {url.redacted!r}: "
                "seconds to wait for a connection, > 0 and <= 3600"
            )
        self._pool: Any = None
        self._pool_pid = 0
        self._lock = threading.Lock()
        self._on_close: list[Callable[[], None]] = []
        # A stable per-prefix number keeps advisory locks of different stores apart.
        self.lock_namespace = zlib.crc32(self.prefix.encode()) & 0x7FFF or 1
        # Connect once now so a bad URL fails here, quickly and clearly.
        conn = self.connect()
        conn.close()

    def connect(self, autocommit: bool = True) -> Any:
        """A new connection outside the pool (for LISTEN and long-lived readers)."""
        try:
            conn = psycopg.connect(self.url.target, autocommit=autocommit, connect_timeout=10)
            self._configure(conn)
            return conn
        except psycopg.Error as exc:
            if exc.sqlstate is None:  # refused, unreachable, timed out: may come back
                raise DatabaseUnavailableError(
                    f"connect to PostgreSQL store {self.url.redacted!r}", first_line(exc)
                ) from exc
            raise StoreConnectionError(  # refused by the server: bad password, no database
                f"cannot connect to PostgreSQL store {self.url.redacted!r}: {first_line(exc)}"
            ) from exc

    def _configure(self, conn: Any) -> None:
        if not self.create:
            # Read-only open: the server refuses every write of this session.
            conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            if not conn.autocommit:
                conn.commit()

    def _get_pool(self) -> Any:
        pid = os.getpid()
        pool = self._pool
        if pool is not None and self._pool_pid == pid:
            return pool
        with self._lock:
            if self._pool is None or self._pool_pid != pid:
                # A forked child gets its own pool; the parent's sockets are not ours to use.
                self._pool = ConnectionPool(
                    self.url.target,
                    min_size=self._pool_min,
                    max_size=self._pool_max,
                    kwargs={"autocommit": True},
                    configure=self._configure,
                    # A connection that went stale (server restarted, network cut) is
                    # replaced at checkout instead of failing the caller's statement.
                    check=_check_connection,
                    timeout=self.pool_timeout,
                    # Give up a failing reconnection early: the next checkout starts a fresh
                    # attempt at once, instead of waiting out a backoff grown while the
                    # server was down.
                    reconnect_timeout=self.pool_timeout,
                    open=True,
                    name=f"eventlanes-{self.prefix}",
                )
                self._pool_pid = pid
            return self._pool

    @contextmanager
    def transaction(self, pipeline: bool = False) -> Iterator[Any]:
        with self._get_pool().connection() as conn:
            if not pipeline:
                with conn.transaction():
                    yield conn
                return
            with pipelined(conn):
                yield conn

    def sync(self, conn: Any) -> None:
        if conn.pgconn.pipeline_status:  # pq.PipelineStatus.OFF is 0
            # Fetching a result reads every result queued before it (after a flush request):
            # one round trip, no Sync message (a nested pipeline block would cost two).
            conn.execute("SELECT 1").fetchone()

    @contextmanager
    def connection(self) -> Iterator[Any]:
        with self._get_pool().connection() as conn:
            yield conn

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """``?`` placeholders work here as on SQLite (:mod:`.placeholders`)."""
        return super().query(*for_psycopg(sql, params))

    def lock(self, conn: Any, key: str) -> None:
        conn.execute(
            "SELECT pg_advisory_xact_lock(%s, %s)",
            (self.lock_namespace, zlib.crc32(key.encode()) - 2**31),
        )

    def translate(self, exc: BaseException, operation: str) -> EventlanesError | None:
        if not isinstance(exc, psycopg.Error):
            return None
        cause = f"{first_line(exc)} (PostgreSQL store {self.url.redacted!r})"
        if is_permanent(exc):  # before OperationalError: psycopg files program limits there
            return InvalidInputError(f"{operation}: PostgreSQL refused the value: {cause}")
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            # Lost or refused connections, server shutdown or restart, pool timeouts (a
            # PoolTimeout is an OperationalError), disk full, serialization failures.
            return DatabaseUnavailableError(operation, cause)
        if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
            return StoreConnectionError(f"{operation} failed: the store is read-only: {cause}")
        return StoreConnectionError(f"{operation} failed: {cause}")

    def _exists(self, kind: str, name: str) -> bool:
        sql = {
            "table": "SELECT to_regclass(%s) IS NOT NULL",
            "sequence": "SELECT to_regclass(%s) IS NOT NULL",
            "function": "SELECT EXISTS (SELECT 1 FROM pg_proc WHERE proname = %s "
            "AND pg_function_is_visible(oid))",
        }[kind]
        return bool(self.query(sql, (name,))[0][0])

    @contextmanager
    def ddl_transaction(self) -> Iterator[Any]:
        with self.transaction() as conn:
            # Concurrent CREATE ... IF NOT EXISTS can still collide in the catalog: serialise
            # (the key earlier releases took for their DDL at open, so they wait for us too).
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (self.lock_namespace,))
            yield conn

    def on_close(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` when the database closes: for what holds a connection outside the pool."""
        self._on_close.append(fn)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
            closers, self._on_close = self._on_close, []
        for fn in closers:
            fn()
        if pool is not None and self._pool_pid == os.getpid():
            pool.close()
