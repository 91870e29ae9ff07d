"""States computed elsewhere (a Spark replay), staged beside the states table in bounded
chunks, then moved in by one short transaction that also moves the tokens.

Staging holds no lock other writers wait for: on SQLite the stage is a temporary table of the
thread's connection (its own file, so the heartbeat's writes go on); on PostgreSQL an
unlogged table of its own, named after the aggregation (a replay holds every segment's claim,
so one replay at a time uses it; a crashed replay's leftover is dropped by the next), or, for
a role that may not create tables in the schema, a temporary table of a connection the stage
holds. Until
:meth:`StagedStates.replace` commits, the stored states and tokens are untouched: a crash at
any point before leaves the last committed replay (or run) as it was.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .states import StateTable

#: (aggregation, key, value JSON, offsets JSON, dropped, dropped_by JSON)
COLUMNS = "aggregation, key, value, offsets, dropped, dropped_by"


#: PostgreSQL's insufficient_privilege
DENIED = "42501"


@contextmanager
def temporary_writes(db: Any) -> Iterator[Any]:
    """SQLite: a transaction of the thread's connection that writes its temporary tables only
    (deferred: no lock on the store, the other writers go on), rolled back if the block
    fails."""
    with db.connection() as conn:
        conn.execute("BEGIN")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")


class StagedStates:
    """``with StagedStates(table, name) as stage: stage.add(rows); stage.replace(names, fn)``

    ``shared``: the stage is a table other sessions see (PostgreSQL's unlogged table, which
    executors write); False when it is a temporary table of this process's connection (SQLite
    always; PostgreSQL when the role may not create tables in the schema, as the production
    role of the docs may not: then a connection of its own holds the stage)."""

    def __init__(self, table: StateTable, name: str) -> None:
        self.table = table
        self.db = db = table.db
        self.postgres = db.backend == "postgresql"
        self.shared = self.postgres
        self._own: Any = None  # PostgreSQL: the connection that holds a temporary stage
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        if self.postgres:  # the prefix is validated; the rest is hex
            self.stage = db.table(f"replay_{digest}")
        else:
            self.stage = f"temp.{db.table('replay_states')}"

    def __enter__(self) -> StagedStates:
        columns = """(aggregation TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
            offsets TEXT NOT NULL, dropped BIGINT NOT NULL, dropped_by TEXT"""
        if not self.postgres:
            self._drop()
            self._run(f"CREATE TABLE {self.stage} {columns})")
            return self
        try:
            self._drop()
            # job, task: the Spark task that wrote the row
            self._run(f"CREATE UNLOGGED TABLE {self.stage} {columns}, job INTEGER, task INTEGER)")
        except Exception as exc:
            if getattr(exc, "sqlstate", None) != DENIED:
                raise
            self.shared = False
            self.stage = f"pg_temp.{self.stage}"
            postgres: Any = self.db  # a connection outside the pool, for the replay's length
            self._own = postgres.connect()
            # pg_temp: a temporary table (needs only TEMPORARY, which every role has by default)
            self._run(f"CREATE TABLE {self.stage} {columns}, job INTEGER, task INTEGER)")
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._drop()
        finally:
            if self._own is not None:
                self._own.close()  # its temporary table goes with it
                self._own = None

    @contextmanager
    def _transaction(self) -> Iterator[Any]:
        """PostgreSQL: a transaction on the stage's own connection, or the pool's."""
        if self._own is not None:
            with self._own.transaction():
                yield self._own
            return
        with self.db.transaction() as conn:
            yield conn

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        if self._own is not None:
            yield self._own
            return
        with self.db.connection() as conn:
            yield conn

    def _run(self, statement: str) -> None:
        """PostgreSQL: in a transaction of its own; SQLite: on the thread's connection (the
        temporary table is its own, and takes no lock on the store)."""
        with self._transaction() if self.postgres else self.db.connection() as conn:
            conn.execute(statement)

    def _drop(self) -> None:
        if self.postgres:
            self._run(f"DROP TABLE IF EXISTS {self.stage}")
        else:
            with self.db.connection() as conn:
                if not conn.in_transaction:
                    conn.execute(f"DROP TABLE IF EXISTS {self.stage}")

    def add(self, rows: Sequence[tuple[str, str, str, str, int, str | None]]) -> None:
        """Stage ``rows`` (:data:`COLUMNS`), in a transaction of their own."""
        if not rows:
            return
        if self.postgres:
            copy_in = f"COPY {self.stage} ({COLUMNS}) FROM STDIN"
            with self._transaction() as conn, conn.cursor() as cur, cur.copy(copy_in) as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            with temporary_writes(self.db) as conn:
                conn.executemany(f"INSERT INTO {self.stage} VALUES (?, ?, ?, ?, ?, ?)", rows)

    def count(self) -> int:
        """The states staged (by this process and by others: executors)."""
        with self._connection() as conn:
            return int(conn.execute(f"SELECT count(*) FROM {self.stage}").fetchone()[0])

    def rows(self, size: int = 20_000) -> Iterator[list[tuple[str, str, str]]]:
        """The staged (aggregation, key, value) in (aggregation, key) order, ``size`` rows at
        a time (PostgreSQL: a server-side cursor; SQLite: the thread's connection, which
        holds the stage), so that a reader's memory does not grow with the states."""
        select = f"SELECT aggregation, key, value FROM {self.stage} ORDER BY aggregation, key"
        return self._read(select, (), size)

    def states_of(self, name: str, size: int = 20_000) -> Iterator[list[tuple[str, str, str]]]:
        """The staged (key, value, offsets) of aggregation ``name`` in key order, ``size`` rows
        at a time (as :meth:`rows`)."""
        select = self.db.sql(
            f"SELECT key, value, offsets FROM {self.stage} WHERE aggregation = ? ORDER BY key"
        )
        return self._read(select, (name,), size)

    def _read(self, select: str, params: tuple[Any, ...], size: int) -> Iterator[list[Any]]:
        if self.postgres:
            with self._transaction() as conn, conn.cursor(name="eventlanes_stage") as cur:
                cur.execute(select, params)
                while batch := cur.fetchmany(size):
                    yield batch
            return
        with self.db.connection() as conn:
            cur = conn.execute(select, params)
            while batch := cur.fetchmany(size):
                yield batch

    def clear(self) -> None:
        """Forget what was staged (a plan run again)."""
        self._run(f"{'TRUNCATE' if self.postgres else 'DELETE FROM'} {self.stage}")

    def replace(self, names: Iterable[str], then: Callable[[Any], None]) -> None:
        """In one transaction: the states of ``names`` become exactly the staged ones (a state
        the replay did not produce does not exist), and ``then(conn)`` (the tokens)."""
        t = self.table.table
        # SQLite: in the states' order (neighbouring rows of their B-tree written together;
        # the sort spills to a temporary file). A key staged twice fails the primary key.
        order = "" if self.postgres else " ORDER BY aggregation, key"
        move = f"""INSERT INTO {t} ({COLUMNS}, updated_at)
            SELECT {COLUMNS}, {self.db.now_ms} FROM {self.stage}{order}"""
        with self._transaction() if self.postgres else self.db.transaction() as conn:
            for name in names:
                conn.execute(self.db.sql(f"DELETE FROM {t} WHERE aggregation = ?"), (name,))
            conn.execute(move)
            then(conn)
