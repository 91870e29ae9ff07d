"""SQLite event store. Writers are serialised by SQLite's write lock, so positions are handed
out in commit order and a reader can never miss an event committed late."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from ..db.sqlite import SQLiteDatabase
from ..errors import ConcurrencyError
from ..events import Event
from .base import EncodedEvent, EventStore, segment_sql

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_COLUMNS = "position, stream_id, version, type, data, metadata, recorded_at, routing_hash"


class SQLiteEventStore(EventStore):
    columns_sql = _COLUMNS

    def __init__(self, db: SQLiteDatabase) -> None:
        super().__init__(db)
        t = self.events_table
        db.run_ddl(
            [
                f"""CREATE TABLE IF NOT EXISTS {t} (
                    position INTEGER PRIMARY KEY,
                    stream_id TEXT NOT NULL,
                    version INTEGER NOT NULL,
                    type TEXT NOT NULL,
                    data TEXT NOT NULL,
                    metadata TEXT NOT NULL,
                    recorded_at INTEGER NOT NULL,
                    routing_hash INTEGER NOT NULL,
                    UNIQUE (stream_id, version))""",
                f"CREATE INDEX IF NOT EXISTS {t}_recorded_at ON {t} (recorded_at)",
            ]
        )

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
            (last + i, stream_id, current + i, e.type, e.data, e.metadata, now, routing_hash)
            for i, e in enumerate(events, 1)
        ]
        conn.executemany(f"INSERT INTO {t} ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
        return [row[0] for row in rows]

    def _read(self, after: int, limit: int, segments: list[tuple[int, int]] | None) -> list[Event]:
        cond, params = segment_sql(segments, "?")
        sql = (
            f"SELECT {_COLUMNS} FROM {self.events_table} WHERE position > ?{cond} "
            "ORDER BY position LIMIT ?"
        )
        with self.db.connection() as conn:
            rows = conn.execute(sql, (after, *params, limit)).fetchall()
        return [Event(*row) for row in rows]

    def _read_upto(
        self, after: int, limit: int, segments: list[tuple[int, int]] | None
    ) -> tuple[list[Event], int]:
        cond, params = segment_sql(segments, "?")
        # One read transaction: the head and the events come from the same snapshot.
        with self.db.snapshot() as conn:  # type: ignore[attr-defined]
            head = conn.execute(f"SELECT coalesce(max(position), 0) FROM {self.events_table}")
            head = head.fetchone()[0]
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM {self.events_table} WHERE position > ? AND position <= ?"
                f"{cond} ORDER BY position LIMIT ?",
                (after, head, *params, limit),
            ).fetchall()
        events = [Event(*row) for row in rows]
        return events, events[-1].position if len(events) == limit else max(after, head)

    def _read_stream(self, stream_id: str, after_version: int, limit: int | None) -> list[Event]:
        sql = (
            f"SELECT {_COLUMNS} FROM {self.events_table} WHERE stream_id = ? AND version > ? "
            "ORDER BY version LIMIT ?"
        )
        with self.db.connection() as conn:
            rows = conn.execute(sql, (stream_id, after_version, -1 if limit is None else limit))
            return [Event(*row) for row in rows.fetchall()]

    def _head(self) -> int:
        return self.db.query(f"SELECT coalesce(max(position), 0) FROM {self.events_table}")[0][0]

    def _stream_version(self, stream_id: str) -> int:
        sql = f"SELECT coalesce(max(version), 0) FROM {self.events_table} WHERE stream_id = ?"
        return self.db.query(sql, (stream_id,))[0][0]

    def _position_at(self, when: datetime) -> int | None:
        micros = (when - _EPOCH) // timedelta(microseconds=1)
        sql = f"SELECT min(position) FROM {self.events_table} WHERE recorded_at >= ?"
        return self.db.query(sql, (micros,))[0][0]
