"""SQLite event store. Writers are serialised by SQLite's write lock, so positions are handed
out in commit order and a reader can never miss an event committed late.

A row with text that is not valid UTF-8 (written behind the store's back) makes sqlite3 fail
the whole fetch. Reads then fetch the same rows again with a tolerant text factory and return
that event as a corrupt one (see :mod:`eventlanes.events`) next to the others.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from ..db.sqlite import SQLiteDatabase
from ..errors import ConcurrencyError, CorruptEventError
from ..events import Event, Undecodable
from ..schema import require
from .base import EncodedEvent, EventStore

T = TypeVar("T")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_COLUMNS = "position, stream_id, version, type, data, metadata, recorded_at, routing_hash"
_TEXT_COLUMNS = {1: "stream_id", 3: "type", 4: "data", 5: "metadata"}


class _BadText(bytes):
    """Stored text that is not valid UTF-8, as fetched by the tolerant text factory."""


def _tolerant_text(raw: bytes) -> str | _BadText:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return _BadText(raw)


def _events(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[Event]:
    """Events built row by row as the cursor yields them: no list of row tuples is kept (a
    batch's tuples would outlive several garbage-collector passes and be promoted to the old
    generation, making full collections, which scan every live object, run more often)."""
    try:
        return [Event(*row) for row in conn.execute(sql, params)]
    except sqlite3.OperationalError as exc:
        if "decode to UTF-8" not in str(exc):
            raise
    return [Event(*row) for row in _fetch(conn, sql, params)]


def _fetch(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError as exc:
        if "decode to UTF-8" not in str(exc):
            raise
    conn.text_factory = _tolerant_text
    try:
        rows = conn.execute(sql, params).fetchall()
    finally:
        conn.text_factory = str
    return [_repair(row) if any(type(v) is _BadText for v in row) else row for row in rows]


def _repair(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A row with invalid UTF-8: routing text decoded with replacement characters, and the
    reason in place of data and metadata (raised when they are accessed)."""
    values = list(row)
    bad = [name for i, name in _TEXT_COLUMNS.items() if type(values[i]) is _BadText]
    for i in (1, 3):
        if type(values[i]) is _BadText:
            values[i] = bytes(values[i]).decode(errors="replace")
    reason = f"{' and '.join(bad)} {'is' if len(bad) == 1 else 'are'} not valid UTF-8"
    if bad[0] in ("stream_id", "type"):  # the event cannot be trusted at all
        values[4] = values[5] = Undecodable(reason)
    else:
        for i in (4, 5):
            if type(values[i]) is _BadText:
                values[i] = Undecodable(f"{_TEXT_COLUMNS[i]} is not valid UTF-8")
    return tuple(values)


class SQLiteEventStore(EventStore):
    columns_sql = _COLUMNS
    times_sql = "position, type, data, recorded_at"

    def __init__(self, db: SQLiteDatabase) -> None:
        super().__init__(db)
        require(db, "events")  # the table: eventlanes.schema.v1_initial

    def _append(
        self,
        stream_id: str,
        routing_hash: int,
        events: list[EncodedEvent],
        expected_version: int | None,
        conn: Any,
    ) -> list[int]:
        if conn is not None:
            return self._append_in(conn, stream_id, routing_hash, events, expected_version)
        with self.db.transaction() as tx:
            return self._append_in(tx, stream_id, routing_hash, events, expected_version)

    def _append_in(
        self,
        conn: Any,
        stream_id: str,
        routing_hash: int,
        events: list[EncodedEvent],
        expected_version: int | None,
    ) -> list[int]:
        t = self.events_table
        current = conn.execute(
            f"SELECT coalesce(max(version), 0) FROM {t} WHERE stream_id = ?", (stream_id,)
        ).fetchone()[0]
        if expected_version is not None and current != expected_version:
            raise ConcurrencyError(stream_id, expected_version, current)
        last = conn.execute(f"SELECT coalesce(max(position), 0) FROM {t}").fetchone()[0]
        now = time.time_ns() // 1000
        rows = [
            (last + i, stream_id, current + i, type_, data, meta, now, routing_hash)
            for i, (type_, data, meta) in enumerate(events, 1)
        ]
        conn.executemany(f"INSERT INTO {t} ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
        return [row[0] for row in rows]

    def _read(self, after: int, limit: int, cond: str, params: list[Any]) -> list[Event]:
        sql = (
            f"SELECT {_COLUMNS} FROM {self.events_table} WHERE position > ?{cond} "
            "ORDER BY position LIMIT ?"
        )
        with self.db.connection() as conn:
            return _events(conn, sql, (after, *params, limit))

    def _read_upto(
        self, after: int, limit: int, cond: str, params: list[Any]
    ) -> tuple[list[Event], int]:
        # One read transaction: the head and the events come from the same snapshot.
        with self.db.snapshot() as conn:  # type: ignore[attr-defined]
            head = conn.execute(f"SELECT coalesce(max(position), 0) FROM {self.events_table}")
            head = head.fetchone()[0]
            events = _events(
                conn,
                f"SELECT {_COLUMNS} FROM {self.events_table} WHERE position > ? AND position <= ?"
                f"{cond} ORDER BY position LIMIT ?",
                (after, head, *params, limit),
            )
        return events, events[-1].position if len(events) == limit else max(after, head)

    def fold_upto(
        self, after: int, span: int, consume: Callable[[sqlite3.Connection, int], T]
    ) -> tuple[T, int]:
        """``consume(conn, upto)``: queries over the events with ``after < position <= upto``,
        all in one read transaction; returns what it returned and ``upto``: the head that
        transaction sees, at most ``after + span``. As in :meth:`read_upto`, every event up
        to there is committed (SQLite serialises writers), so a consumer moving its token to
        ``upto`` skips nothing. For folds run in SQL (aggregations): sqlite3 errors (malformed
        JSON, an integer overflow) are the caller's."""
        with self.db.snapshot() as conn:  # type: ignore[attr-defined]
            head = conn.execute(f"SELECT coalesce(max(position), 0) FROM {self.events_table}")
            upto = max(after, min(head.fetchone()[0], after + span))
            return consume(conn, upto), upto

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
        params = (stream_id, after_version, *until, -1 if limit is None else limit)
        with self.db.connection() as conn:
            return _events(conn, sql, params)

    def _raw_rows(self, conn: Any, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        rows = _fetch(conn, sql, params)
        for row in rows:
            for value in row[4:6]:
                if isinstance(value, Undecodable):  # bulk readers get no Event to carry it
                    raise CorruptEventError(row[0], value.reason)
        return rows

    def arrow_connection(self) -> sqlite3.Connection:
        """A new connection to the file, read-only whatever the store's: SQLite refuses every
        write on it (``mode=ro``). Python's own SQLite, never a second copy of the library (the
        ADBC driver bundles one): POSIX locks belong to the process, and another library
        closing its descriptor of the file drops the locks this one holds (a write
        transaction's among them), letting a second writer in beside it: a malformed file."""
        db: SQLiteDatabase = self.db  # type: ignore[assignment]
        conn = sqlite3.connect(
            db.read_only_uri(), uri=True, isolation_level=None, check_same_thread=False,
            timeout=db.busy_ms / 1000,
        )  # fmt: skip
        conn.execute(f"PRAGMA busy_timeout = {int(db.busy_ms)}")
        return conn

    def _scan_arrow(
        self,
        after: int,
        until: int,
        pairs: list[tuple[int, int]] | None,
        types: list[str] | None,
        columns: list[str],
    ) -> Iterator[Any]:
        import pyarrow as pa

        from . import arrow

        cond, params = self._filter(pairs, types)
        sql = (
            f"SELECT {', '.join(columns)} FROM {self.events_table} WHERE position > ? "
            f"AND position <= ?{cond} ORDER BY position"
        )
        full = arrow.schema()
        # Text as bytes, viewed as strings without a copy: arrow.checked validates the UTF-8
        # of every value in C and names the event whose text is not.
        kinds = [pa.binary() if full.field(n).type == pa.string() else pa.int64()
                 for n in columns]  # fmt: skip
        conn = self.arrow_connection()
        conn.text_factory = bytes
        try:
            # One statement: one snapshot, held until its last row is fetched.
            cur = conn.execute(sql, (after, until, *params))
            while rows := cur.fetchmany(arrow.BATCH_ROWS):
                arrays = [
                    pa.array(values, type=kind).view(pa.string()) if kind == pa.binary()
                    else pa.array(values, type=kind)
                    for values, kind in zip(zip(*rows, strict=True), kinds, strict=True)
                ]  # fmt: skip
                yield arrow.checked(pa.RecordBatch.from_arrays(arrays, names=columns), columns)
        except sqlite3.Error as exc:
            translated = self.db.translate(exc, f"Arrow scan after position {after}")
            raise (translated or exc) from exc
        finally:
            conn.close()

    def _head(self) -> int:
        return self.db.query(f"SELECT coalesce(max(position), 0) FROM {self.events_table}")[0][0]

    def _stream_version(self, stream_id: str) -> int:
        sql = f"SELECT coalesce(max(version), 0) FROM {self.events_table} WHERE stream_id = ?"
        return self.db.query(sql, (stream_id,))[0][0]

    def _position_at(self, when: datetime) -> int | None:
        micros = (when - _EPOCH) // timedelta(microseconds=1)
        sql = f"SELECT min(position) FROM {self.events_table} WHERE recorded_at >= ?"
        return self.db.query(sql, (micros,))[0][0]
