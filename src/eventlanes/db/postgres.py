"""PostgreSQL backend: psycopg 3 with a connection pool (created lazily, per process)."""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..errors import InvalidInputError, StoreConnectionError
from .base import Database
from .url import DatabaseURL

try:  # PostgreSQL support is an extra: pip install 'eventlanes[postgres]'
    import psycopg
    from psycopg_pool import ConnectionPool
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]
    ConnectionPool = None  # type: ignore[assignment,misc]


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
        self._pool: Any = None
        self._pool_pid = 0
        self._lock = threading.Lock()
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
            raise StoreConnectionError(
                f"cannot connect to PostgreSQL store {self.url.redacted!r}: {exc}".strip()
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
                    open=True,
                    name=f"eventlanes-{self.prefix}",
                )
                self._pool_pid = pid
            return self._pool

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        with self._get_pool().connection() as conn, conn.transaction():
            yield conn

    @contextmanager
    def connection(self) -> Iterator[Any]:
        with self._get_pool().connection() as conn:
            yield conn

    def lock(self, conn: Any, key: str) -> None:
        conn.execute(
            "SELECT pg_advisory_xact_lock(%s, %s)",
            (self.lock_namespace, zlib.crc32(key.encode()) - 2**31),
        )

    def _exists(self, kind: str, name: str) -> bool:
        sql = {
            "table": "SELECT to_regclass(%s) IS NOT NULL",
            "sequence": "SELECT to_regclass(%s) IS NOT NULL",
            "function": "SELECT EXISTS (SELECT 1 FROM pg_proc WHERE proname = %s "
            "AND pg_function_is_visible(oid))",
        }[kind]
        return bool(self.query(sql, (name,))[0][0])

    def _run_ddl(self, statements: Sequence[str]) -> None:
        with self.transaction() as conn:
            # Concurrent CREATE ... IF NOT EXISTS can still collide in the catalog: serialise.
            conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (self.lock_namespace,))
            for statement in statements:
                conn.execute(statement)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None and self._pool_pid == os.getpid():
            pool.close()
