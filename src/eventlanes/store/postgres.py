"""PostgreSQL event store: writes scale with writers and readers never skip an event.

Why this is not trivial: sequence values are handed out at insert, not at commit, so with many
writers a reader can see position 7 committed while position 6 is still in flight; if it then
moves its cursor past 7 it skips 6 forever (the bug class behind Axon #4829 and Marten #3321).

How it is solved here, without a table lock:
* Appenders of one stream are serialised by a transaction advisory lock on the stream's hash,
  taken before the version check, so positions within a stream follow versions even when the
  appending transaction wrote other rows first.
* Just before it allocates positions, an appender takes a *shared* transaction advisory lock
  whose key encodes the next value the position sequence will hand out: a lower bound of every
  position it is about to use. The lock is visible in ``pg_locks`` at once and released at
  commit or abort (after the commit is visible to new snapshots).
* A reader computes a horizon: first the sequence's last handed-out value L, then the lowest
  in-flight marker M. Every position <= min(L, M - 1) belongs to a transaction that committed
  or aborted, so a later snapshot sees all of them. Reads stop at the horizon.
The order of those two steps on both sides is what makes it safe: a marker not yet visible to
the reader belongs to an appender whose positions will all be above the L the reader saw.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from ..db.postgres import PostgresDatabase, pipelined
from ..errors import ConcurrencyError, InvalidInputError
from ..events import Event, NewEvent
from ..hashing import stable_hash
from ..schema import require
from ..schema.v1_initial import MARKER_SHIFT, VERSION_CONFLICT
from ..tracing import propagation
from .base import EncodedEvent, EventStore, ReadWait, SegmentSpec, segment_pairs, segment_sql

# Read in binary: JSON as text (decoded lazily by Event) and the timestamp as Unix epoch
# microseconds. A binary timestamptz is 8 bytes of microseconds since 2000-01-01: shifted by 30
# years in SQL (an interval of seconds only: one addition, no calendar or time zone work), it
# holds microseconds since 1970, which psycopg's C int8 loader reads as they are. Building a
# datetime per row, converting in SQL (extract epoch: numeric), or a Python loader per row were
# the largest costs of a full scan.
_COLUMNS = (
    "position, stream_id, version, type, data::text, metadata::text, "
    "recorded_at + interval '946684800 seconds', routing_hash"
)


def _micros_loader() -> Any:
    """psycopg's int8 binary loader (C in psycopg's binary package), for timestamptz."""
    import psycopg
    from psycopg.pq import Format

    return psycopg.adapters.get_loader(psycopg.adapters.types["int8"].oid, Format.BINARY)


class _Notifier:
    """Sends NOTIFY for committed appends from a thread of its own, on its own connection.

    NOTIFY inside the appending transaction would hold PostgreSQL's notify-queue lock across
    the commit's WAL flush and serialise all writers; here appends only set a flag, and one
    NOTIFY covers every append committed since the last one.
    """

    def __init__(self, db: PostgresDatabase, channel: str) -> None:
        self.db = db
        self.channel = channel
        self._wanted = threading.Event()
        self._pid = 0
        self._lock = threading.Lock()
        self._closed = False
        self._thread: threading.Thread | None = None

    def poke(self) -> None:
        if self._pid != os.getpid():  # first use in this process (or after a fork)
            with self._lock:
                if self._pid != os.getpid() and not self._closed:
                    self._wanted = threading.Event()
                    self._thread = threading.Thread(
                        target=self._run, name="eventlanes-notify", daemon=True
                    )
                    self._thread.start()
                    self._pid = os.getpid()
        self._wanted.set()

    def close(self) -> None:
        """End the thread and its connection (a store opened and closed again must not leave
        them behind: a process that does so often would use up the server's connections)."""
        with self._lock:
            self._closed = True
            thread = self._thread if self._pid == os.getpid() else None
        self._wanted.set()
        if thread is not None:
            thread.join(timeout=5.0)

    def _run(self) -> None:
        wanted = self._wanted
        conn = None
        while True:
            wanted.wait()
            wanted.clear()
            if self._closed:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                return
            try:
                if conn is None or conn.closed:
                    conn = self.db.connect(autocommit=True)
                conn.execute("SELECT pg_notify(%s, '')", (self.channel,))
            except Exception:  # noqa: BLE001 - consumers fall back to polling
                conn = None
                time.sleep(0.5)


def _append_params(
    stream_id: str, expected_version: int | None, routing_hash: int, events: list[EncodedEvent]
) -> tuple[Any, ...]:
    """The append function's arguments: the events as arrays of types, data and metadata."""
    return (stream_id, expected_version, routing_hash, [e[0] for e in events],
            [e[1] for e in events], [e[2] for e in events])  # fmt: skip


class PostgresEventStore(EventStore):
    columns_sql = _COLUMNS
    times_sql = "position, type, data::text, recorded_at + interval '946684800 seconds'"

    def __init__(self, db: PostgresDatabase) -> None:
        super().__init__(db)
        self.pg = db
        t = self.events_table
        # The table, its sequence and the append and horizon functions: schema.v1_initial.
        require(db, "events")
        self._append_sql = f"SELECT {t}_append(%s, %s, %s, %s, %s::jsonb[], %s::jsonb[])"
        # Wake consumers (LISTEN) after each append, unless the URL says notify=off.
        notify = db.url.options.get("notify", "on").lower()
        if notify not in ("on", "off"):
            raise InvalidInputError(f"invalid notify={notify!r} in {db.url.redacted!r}: on or off")
        self.notify_channel = f"{t}_appended" if notify == "on" else None
        self._notify_sql = "SELECT pg_notify(%s, '')"
        self._notifier = _Notifier(db, self.notify_channel) if self.notify_channel else None
        if self._notifier is not None:
            db.on_close(self._notifier.close)
        self._horizon_sql = f"SELECT {t}_horizon()"
        self._micros = _micros_loader()

    def _append(
        self,
        stream_id: str,
        routing_hash: int,
        events: list[EncodedEvent],
        expected_version: int | None,
        conn: Any,
    ) -> list[int]:
        import psycopg

        params = _append_params(stream_id, expected_version, routing_hash, events)
        try:
            if conn is not None:
                positions = conn.execute(self._append_sql, params).fetchone()[0]
                if self.notify_channel:  # delivered when the caller commits
                    conn.execute(self._notify_sql, (self.notify_channel,))
                return positions
            # Autocommit: the function call is the whole transaction, in one round trip.
            with self.db.connection() as c:
                positions = c.execute(self._append_sql, params).fetchone()[0]
            if self._notifier is not None:
                self._notifier.poke()
            return positions
        except psycopg.Error as exc:
            if exc.sqlstate == VERSION_CONFLICT:
                actual = int(exc.diag.message_primary or -1)
                raise ConcurrencyError(stream_id, expected_version or 0, actual) from None
            if exc.sqlstate == "23505":  # unique (stream_id, version): lost a race
                raise ConcurrencyError(
                    stream_id, expected_version or 0, self._stream_version(stream_id)
                ) from None
            raise  # the caller's guard names the operation

    def append_runs(self, runs: Sequence[tuple[str, Sequence[NewEvent]]], *, conn: Any) -> int:
        if self.trace_context and propagation.sampled() is not None:
            return super().append_runs(runs, conn=conn)  # each append in a span of its own
        checked = [(stream_id, self._encoded(stream_id, events)) for stream_id, events in runs]
        # Any expected version: no conflict to report (appends to one stream wait for each
        # other's commit on the function's stream lock). Every append goes out before the
        # first result is awaited (in pipeline mode one round trip for all), then one NOTIFY.
        with self.db.guard(f"append {len(checked)} run(s) of events"):
            sent = [
                conn.execute(
                    self._append_sql,
                    _append_params(stream_id, None, stable_hash(stream_id), encoded),
                )
                for stream_id, encoded in checked
            ]
            if self.notify_channel and sent:  # delivered when the caller commits
                conn.execute(self._notify_sql, (self.notify_channel,))
            return sum(len(cur.fetchone()[0]) for cur in sent)

    def horizon(self) -> int:
        """Highest position below which every transaction has finished."""
        with self.db.guard("horizon"), self.db.connection() as conn:
            return conn.execute(self._horizon_sql).fetchone()[0]

    def _read(self, after: int, limit: int, cond: str, params: list[Any]) -> list[Event]:
        return self._read_upto(after, limit, cond, params)[0]

    def _read_upto(
        self, after: int, limit: int, cond: str, params: list[Any]
    ) -> tuple[list[Event], int]:
        # No upper bound in SQL: with a range on both sides PostgreSQL may underestimate the
        # rows (fresh statistics) and sort a bitmap scan instead of walking the primary key.
        # Rows committed above the horizon (past an append still in flight) are cut here.
        sql, args, guard_plan = self._read_sql(after, limit, cond, params)
        with self.db.connection() as conn:
            # One round trip. Two statements on purpose, each with its own snapshot (READ
            # COMMITTED whatever the server's default): the read's snapshot must be taken
            # after the horizon is.
            with pipelined(conn, "BEGIN ISOLATION LEVEL READ COMMITTED"):
                if guard_plan:
                    conn.execute("SET LOCAL enable_sort = off")
                hcur = conn.execute(self._horizon_sql)
                cur = self._cursor(conn)
                cur.execute(sql, args)
            horizon = hcur.fetchone()[0]
            if horizon <= after:
                return [], after
            rows = cur.fetchall()
        if rows and rows[-1][0] > horizon:
            # Every row of the filter up to the horizon came before the first one past it.
            return [Event(*row) for row in rows if row[0] <= horizon], horizon
        events = [Event(*row) for row in rows]
        return events, events[-1].position if len(events) == limit else horizon

    def _read_sql(
        self, after: int, limit: int, cond: str, params: list[Any]
    ) -> tuple[str, list[Any], bool]:
        """The read's SQL, its parameters, and whether sorting must be ruled out.

        A segment filter (routing_hash & mask = id) has no statistics: PostgreSQL guesses a
        handful of matching rows and reads the whole backlog after ``after`` (bitmap scan,
        then sort) on every read. Without sorting it walks an index in position order and
        stops at the limit: the primary key, or the (type, position) index for one type. For
        several types, one such walk per type, merged in position order (a walk of the primary
        key past rare types could read far more than the limit)."""
        t = self.events_table
        plain = f"SELECT {_COLUMNS} FROM {t} WHERE position > %s{cond} ORDER BY position LIMIT %s"
        if "routing_hash" not in cond:
            return plain, [after, *params, limit], False
        types_at = cond.find(" AND type IN (")
        types = cond[types_at:].count("%s") if types_at >= 0 else 0
        if types <= 1:
            return plain, [after, *params, limit], True
        by_segment, names = params[: len(params) - types], params[len(params) - types :]
        arm = (
            f"(SELECT {_COLUMNS} FROM {t} WHERE position > %s{cond[:types_at]} AND type = %s "
            "ORDER BY position LIMIT %s)"
        )
        args: list[Any] = []
        for name in names:
            args += [after, *by_segment, name, limit]
        return " UNION ALL ".join([arm] * types) + " ORDER BY 1 LIMIT %s", [*args, limit], True

    def scan(
        self,
        after: int,
        until: int,
        segments: Iterable[SegmentSpec] | None = None,
        chunk: int = 10_000,
    ) -> Iterator[list[tuple[Any, ...]]]:
        cond, params = segment_sql(segment_pairs(segments), "%s")
        sql = (
            f"SELECT {_COLUMNS} FROM {self.events_table} "
            f"WHERE position > %s AND position <= %s{cond} ORDER BY position LIMIT %s"
        )
        while True:
            with self.db.guard(f"scan after position {after}"), self.db.transaction() as conn:
                # The upper bound stays (a slice must not read past its end); sorting is
                # ruled out so that a misestimate cannot turn the walk along the primary key
                # into a bitmap scan plus sort (the planner's choice on fresh statistics).
                conn.execute("SET LOCAL enable_sort = off")
                rows = self._raw_rows(conn, sql, (after, until, *params, chunk))
            if rows:
                yield rows
            if len(rows) < chunk:
                return
            after = rows[-1][0]

    def arrow_connection(self) -> Any:
        """A new ADBC connection (DB-API, autocommit) to the database, in a read-only session
        whatever the store's: the server refuses every write on it."""
        from . import arrow

        postgres = arrow.driver("postgresql")
        conn = postgres.connect(self.db.url.target, autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        except BaseException:
            conn.close()
            raise
        return conn

    def _scan_arrow(
        self,
        after: int,
        until: int,
        pairs: list[tuple[int, int]] | None,
        types: list[str] | None,
        columns: list[str],
    ) -> Iterator[Any]:
        from psycopg import sql as psql

        from . import arrow

        postgres = arrow.driver("postgresql")
        # Binary COPY: the driver's path for a query without parameters, so the validated
        # integers are written in and the types quoted by psycopg. jsonb comes as its text,
        # timestamptz as microseconds since 1970; sorting is ruled out as in scan (the walk
        # along an index in position order).
        of_types = ""
        if types is not None:
            quoted = ", ".join(psql.Literal(t).as_string() for t in types)
            of_types = f" AND type IN ({quoted})"
        sql = (
            f"SELECT {', '.join(columns)} FROM {self.events_table} WHERE position > {int(after)} "
            f"AND position <= {int(until)}{arrow.segment_literal(pairs)}{of_types} "
            "ORDER BY position"
        )
        what = f"Arrow scan after position {after}"
        where = f"PostgreSQL store {self.db.url.redacted!r}"
        try:
            with self.arrow_connection() as conn, conn.cursor() as cur:
                cur.execute("SET enable_sort = off")
                # The horizon first, then the read (a snapshot of its own, taken after):
                # every row up to an ``until`` at or below it is committed and visible.
                cur.execute(self._horizon_sql)
                (horizon,) = cur.fetchone()
                if until > horizon:
                    raise InvalidInputError(
                        f"Arrow scan up to position {until:,} passes the store's "
                        f"visibility horizon ({horizon:,}): appends below it may still "
                        "commit; read up to store.head()"
                    )
                cur.execute(sql)
                for batch in cur.fetch_record_batch():
                    yield arrow.checked(batch, columns)
        except postgres.Error as exc:
            raise arrow.translate(exc, what, where) from exc

    def _read_stream(
        self,
        stream_id: str,
        after_version: int,
        until_version: int | None,
        limit: int | None,
        backwards: bool,
    ) -> list[Event]:
        sql = self._stream_sql(until_version, backwards)
        until = () if until_version is None else (until_version,)
        with self.db.connection() as conn:
            rows = self._raw_rows(conn, sql, (stream_id, after_version, *until, limit))
        return [Event(*row) for row in rows]

    def _cursor(self, conn: Any) -> Any:
        cur = conn.cursor(binary=True)
        cur.adapters.register_loader("timestamptz", self._micros)
        return cur

    def _raw_rows(self, conn: Any, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        return self._cursor(conn).execute(sql, params).fetchall()

    def _head(self) -> int:
        with self.db.connection() as conn:
            horizon = conn.execute(self._horizon_sql).fetchone()[0]
            row = conn.execute(
                f"SELECT coalesce(max(position), 0) FROM {self.events_table} WHERE position <= %s",
                (horizon,),
            ).fetchone()
        return row[0]

    def read_wait(self) -> ReadWait | None:
        with self.db.guard("read wait"):
            return read_wait(self.pg, self.events_table)

    def _stream_version(self, stream_id: str) -> int:
        sql = f"SELECT coalesce(max(version), 0) FROM {self.events_table} WHERE stream_id = %s"
        return self.db.query(sql, (stream_id,))[0][0]

    def _position_at(self, when: datetime) -> int | None:
        sql = f"SELECT min(position) FROM {self.events_table} WHERE recorded_at >= %s"
        return self.db.query(sql, (when,))[0][0]


def read_wait(db: PostgresDatabase, events_table: str) -> ReadWait | None:
    """The transaction readers wait behind, if committed events lie beyond the horizon: the
    holder of the lowest in-flight marker (the horizon's own rule), with what
    ``pg_stat_activity`` shows this role of it (every role sees the pid and application_name,
    ``xact_start`` only of its own sessions unless it has ``pg_read_all_stats``). Plain
    SELECTs: the read-only status uses it too. Racy by nature (the transaction may end
    meanwhile): for display, never for reading."""
    base = db.lock_namespace << MARKER_SHIFT
    with db.connection() as conn:
        marker = conn.execute(
            """SELECT l.pid, ((l.classid::bigint << 32) | l.objid::bigint) - %s - 1,
                      a.application_name,
                      extract(epoch FROM clock_timestamp() - a.xact_start)::float8
               FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
               WHERE l.locktype = 'advisory' AND l.objsubid = 1
                 AND l.database = (SELECT oid FROM pg_database
                                   WHERE datname = current_database())
               AND (l.classid::bigint >> 16) = %s
               ORDER BY 2, a.xact_start NULLS LAST LIMIT 1""",
            (base, db.lock_namespace),
        ).fetchone()
        if marker is None:
            return None
        pid, horizon, application_name, age = marker
        sql = f"SELECT coalesce(max(position), 0) FROM {events_table}"
        committed = conn.execute(sql).fetchone()[0]
        if committed <= horizon:
            return None
        readable, waited = conn.execute(
            f"""SELECT (SELECT coalesce(max(position), 0) FROM {events_table}
                        WHERE position <= %s),
                       (SELECT extract(epoch FROM clock_timestamp() - recorded_at)::float8
                        FROM {events_table} WHERE position > %s ORDER BY position LIMIT 1)""",
            (horizon, horizon),
        ).fetchone()
    return ReadWait(readable, committed, pid, application_name, age, max(0.0, waited or 0.0))
