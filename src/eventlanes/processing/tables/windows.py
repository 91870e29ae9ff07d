"""The rows of windowed aggregations (schema version 5, :mod:`eventlanes.schema.v5_windows`):
window states, late events and each segment's clock checkpoint with its counts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...db import Database
from ...hashing import stable_hashes
from ...schema import require
from ...segments import Segment
from ...windows.spec import LateEvent, WindowResult
from .staging import temporary_writes
from .states import CHUNK, decode, encode_states, execute_many

#: closed windows past their retention deleted per write: bounded, so a write after a long
#: pause does not hold its transaction for a sweep of the whole table
EXPIRE_BATCH = 10_000
KEYS_PER_STATEMENT = 500  # keys of one IN list (SQLite allows 32,766 parameters)


@dataclass(slots=True)
class Win:
    """A window of a key held by a worker: its end, value, revision, once closed the position
    whose clock closed it, and the position of its latest amendment (None: none)."""

    end: int
    value: Any
    revision: int = 0
    closed_at: int | None = None
    amended_at: int | None = None


@dataclass(slots=True)
class Checkpoint:
    """A segment's clock row: the position, the largest event time read up to it (None before
    any), the counts, and the definition the segment ran with."""

    position: int
    latest: int | None
    definition: str
    folded: int = 0
    late: int = 0
    clamped: int = 0


class WindowTable:
    def __init__(self, db: Database) -> None:
        self.db = db
        require(db, "windows")
        self.states = db.table("window_states")
        self.late_table = db.table("window_late")
        self.clocks = db.table("window_clocks")
        q, s = db.sql, self.states
        self._upsert = q(
            f"""INSERT INTO {s} (aggregation, key, start_us, end_us, routing_hash, value,
                closed_at, revision, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, {db.now_ms})
                ON CONFLICT (aggregation, key, start_us) DO UPDATE SET value = excluded.value,
                end_us = excluded.end_us, closed_at = excluded.closed_at,
                revision = excluded.revision, updated_at = excluded.updated_at"""
        )
        self._back = q(
            f"""SELECT start_us, end_us, closed_at FROM {s} WHERE aggregation = ? AND key = ?
                AND start_us < ? ORDER BY start_us DESC"""
        )
        self._drop = q(f"DELETE FROM {s} WHERE aggregation = ? AND key = ? AND start_us = ?")
        self._open = q(
            f"""SELECT key, start_us, end_us, value, revision FROM {s} WHERE aggregation = ?
                AND closed_at IS NULL AND (routing_hash & ?) = ?"""
        )
        self._closed = q(
            f"""SELECT end_us, value, revision, closed_at FROM {s} WHERE aggregation = ?
                AND key = ? AND start_us = ? AND closed_at IS NOT NULL"""
        )
        # a segment's own windows only: another segment may be behind, and amend one of its
        # own that this segment's clock would call past its retention
        self._expire = q(
            f"""DELETE FROM {s} WHERE aggregation = ? AND (key, start_us) IN (SELECT key,
                start_us FROM {s} WHERE aggregation = ? AND closed_at IS NOT NULL AND
                end_us < ? AND (routing_hash & ?) = ? LIMIT ?)"""
        )
        self._expire_key = q(
            f"""DELETE FROM {s} WHERE aggregation = ? AND key = ? AND closed_at IS NOT NULL
                AND end_us < ?"""
        )
        self._add_late = q(
            f"""INSERT INTO {self.late_table} (aggregation, position, key, t_us, windows,
                amended, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT (aggregation, position) DO NOTHING"""
        )
        c = self.clocks
        self._save_clock = q(
            f"""INSERT INTO {c} (aggregation, segment_id, position, latest, definition, folded,
                late, clamped, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, {db.now_ms})
                ON CONFLICT (aggregation, segment_id) DO UPDATE SET position =
                excluded.position, latest = excluded.latest, definition = excluded.definition,
                folded = excluded.folded, late = excluded.late, clamped = excluded.clamped,
                updated_at = excluded.updated_at"""
        )

    # -- what a worker reads and writes, in its transactions ---------------------------------
    def load_open(self, conn: Any, name: str, segment: Segment) -> list[tuple[Any, ...]]:
        """The open windows of ``segment``'s keys: (key, start, end, value, revision)."""
        rows = conn.execute(self._open, (name, segment.mask, segment.id)).fetchall()
        return [(k, s, e, decode(v), r) for k, s, e, v, r in rows]

    def open_of(self, conn: Any, name: str, keys: list[str]) -> dict[str, dict[int, Win]]:
        """The open windows of ``keys`` (those that have one), by key and start."""
        found: dict[str, dict[int, Win]] = {}
        for i in range(0, len(keys), KEYS_PER_STATEMENT):
            part = keys[i : i + KEYS_PER_STATEMENT]
            sql = self.db.sql(
                f"SELECT key, start_us, end_us, value, revision FROM {self.states} WHERE "
                f"aggregation = ? AND closed_at IS NULL AND key IN ({', '.join('?' * len(part))})"
            )
            for key, start, end, value, revision in conn.execute(sql, (name, *part)):
                found.setdefault(key, {})[start] = Win(end, decode(value), revision)
        return found

    def has_open(self, name: str) -> bool:
        """Whether aggregation ``name`` has a window open (one row read, not a count)."""
        sql = self.db.sql(
            f"SELECT 1 FROM {self.states} WHERE aggregation = ? AND closed_at IS NULL LIMIT 1"
        )
        return bool(self.db.query(sql, (name,)))

    def open_ending(self, conn: Any, name: str, by: int) -> list[tuple[Any, ...]]:
        """The open windows ending at or before ``by``: (key, start, end, value text,
        revision), in key and start order."""
        sql = self.db.sql(
            f"""SELECT key, start_us, end_us, value, revision FROM {self.states} WHERE
                aggregation = ? AND closed_at IS NULL AND end_us <= ? ORDER BY key, start_us"""
        )
        return conn.execute(sql, (name, by)).fetchall()

    def load_closed(self, conn: Any, name: str, key: str, start: int) -> Win | None:
        row = conn.execute(self._closed, (name, key, start)).fetchone()
        return None if row is None else Win(row[0], decode(row[1]), row[2], row[3])

    def save(self, conn: Any, name: str, rows: list[tuple[str, int, Win]]) -> None:
        """Upsert windows: (key, start, window); values encoded a chunk at a time, each
        checked to read back equal (as states are)."""
        for i in range(0, len(rows), CHUNK):
            chunk = rows[i : i + CHUNK]
            keys = [key for key, _, _ in chunk]
            texts = encode_states(name, keys, [w.value for _, _, w in chunk])
            params = [
                (name, key, start, w.end, routing, text, w.closed_at, w.revision)
                for (key, start, w), routing, text in zip(
                    chunk, stable_hashes(keys), texts, strict=True
                )
            ]
            execute_many(conn, self._upsert, params)

    def save_encoded(self, conn: Any, name: str, rows: list[tuple[Any, ...]]) -> None:
        """Insert windows already encoded (a Spark replay's, checked there as :meth:`save`
        checks): (key, start, end, value text, closed_at, revision)."""
        for i in range(0, len(rows), CHUNK):
            execute_many(conn, self._upsert, encoded_rows(name, rows[i : i + CHUNK]))

    def drop(self, conn: Any, name: str, rows: list[tuple[str, int]]) -> None:
        """Delete windows (key, start): session windows merged into another, or whose start
        moved earlier (a row that was never written is no error)."""
        execute_many(conn, self._drop, [(name, key, start) for key, start in rows])

    def closed_within(
        self, conn: Any, name: str, spans: dict[str, tuple[int, int]]
    ) -> dict[str, list[tuple[int, int]]]:
        """The closed windows ``(start, end)`` of each key of ``spans`` that overlap its
        ``[lo, hi)``: a few statements for a batch's keys, rather than one per input."""
        found: dict[str, list[tuple[int, int]]] = {}
        if not spans:
            return found
        keys, lo = sorted(spans), min(lo for lo, _ in spans.values())
        for i in range(0, len(keys), KEYS_PER_STATEMENT):
            part = keys[i : i + KEYS_PER_STATEMENT]
            sql = self.db.sql(
                f"SELECT key, start_us, end_us FROM {self.states} WHERE aggregation = ? AND "
                f"closed_at IS NOT NULL AND end_us > ? AND key IN ({', '.join('?' * len(part))})"
            )
            for key, start, end in conn.execute(sql, (name, lo, *part)):
                low, high = spans[key]
                if start < high and end > low:
                    found.setdefault(key, []).append((start, end))
        return found

    def closed_of_key(
        self, conn: Any, name: str, key: str, low: int, high: int
    ) -> list[tuple[int, int]]:
        """The closed sessions ``(start, end)`` of one key that overlap ``[low, high)``: its
        rows walked back from ``high`` by the primary key, until one ends at or before
        ``low``. A key's sessions never overlap, so their ends are in the order of their
        starts. (:meth:`closed_within` serves many keys at once by the index on ends: for one
        key, it would walk every window of the aggregation ending after ``low``.)"""
        found = []
        for start, end, closed_at in conn.execute(self._back, (name, key, high)):
            if end <= low:
                break
            if closed_at is not None:
                found.append((start, end))
        return found

    def expire(
        self, conn: Any, name: str, before: int, segment: Segment, limit: int = EXPIRE_BATCH
    ) -> int:
        """Delete up to ``limit`` closed windows of ``segment`` that ended before ``before``
        (the rest at the next writes); how many."""
        params = (name, name, before, segment.mask, segment.id, limit)
        return max(0, conn.execute(self._expire, params).rowcount or 0)

    def expire_key(self, conn: Any, name: str, key: str, before: int) -> None:
        """Delete the closed windows of ``key`` that ended before ``before`` (a key's clock:
        a few per key, written with it)."""
        conn.execute(self._expire_key, (name, key, before))

    def add_late(self, conn: Any, name: str, rows: list[tuple[Any, ...]]) -> None:
        """(position, key, t, windows, amended, recorded_at) of late inputs."""
        execute_many(conn, self._add_late, late_rows(name, rows))

    def checkpoint(self, conn: Any, name: str, segment_id: int) -> Checkpoint | None:
        row = conn.execute(
            self.db.sql(
                f"""SELECT position, latest, definition, folded, late, clamped FROM
                    {self.clocks} WHERE aggregation = ? AND segment_id = ?"""
            ),
            (name, segment_id),
        ).fetchone()
        return None if row is None else Checkpoint(*row)

    def clock_at(self, conn: Any, name: str, position: int) -> tuple[int, int | None]:
        """A start for the store clock at ``position``: the latest checkpoint of any segment
        at or below it, else (0, None) (read from the first event)."""
        row = conn.execute(
            self.db.sql(
                f"""SELECT position, latest FROM {self.clocks} WHERE aggregation = ? AND
                    position <= ? ORDER BY position DESC LIMIT 1"""
            ),
            (name, position),
        ).fetchone()
        return (0, None) if row is None else (row[0], row[1])

    def save_checkpoint(self, conn: Any, name: str, segment_id: int, cp: Checkpoint) -> None:
        conn.execute(
            self._save_clock,
            (name, segment_id, cp.position, cp.latest, cp.definition, cp.folded, cp.late,
             cp.clamped),
        )  # fmt: skip

    def delete_all(self, conn: Any, name: str) -> None:
        for table in (self.states, self.late_table, self.clocks):
            conn.execute(self.db.sql(f"DELETE FROM {table} WHERE aggregation = ?"), (name,))

    # -- what users read -------------------------------------------------------------------
    def definitions(self, name: str) -> set[str]:
        sql = self.db.sql(f"SELECT DISTINCT definition FROM {self.clocks} WHERE aggregation = ?")
        return {d for (d,) in self.db.query(sql, (name,))}

    def counts(self, name: str) -> dict[str, int]:
        """Inputs folded, late and clamped, over every segment."""
        sql = self.db.sql(
            f"""SELECT coalesce(sum(folded), 0), coalesce(sum(late), 0),
                coalesce(sum(clamped), 0) FROM {self.clocks} WHERE aggregation = ?"""
        )
        folded, late, clamped = self.db.query(sql, (name,))[0]
        return {"folded": int(folded), "late": int(late), "clamped": int(clamped)}

    def summary(self, name: str) -> dict[str, Any]:
        """What status shows of a windowed aggregation: its counts, its clock (the largest
        event time read, in microseconds; None before any), the windows open and the end of
        the oldest (None: none open)."""
        clock = self.db.query(
            self.db.sql(f"SELECT max(latest) FROM {self.clocks} WHERE aggregation = ?"), (name,)
        )[0][0]
        opened, oldest = self.db.query(
            self.db.sql(
                f"""SELECT count(*), min(end_us) FROM {self.states} WHERE aggregation = ?
                    AND closed_at IS NULL"""
            ),
            (name,),
        )[0]
        counts = self.counts(name)
        return {**counts, "clock_us": clock, "open": int(opened), "oldest_end_us": oldest}

    def windows(
        self, name: str, key: str, since: int | None, until: int | None
    ) -> list[WindowResult]:
        """The windows of ``key`` kept, in time order; ``since``/``until``: those ending
        after ``since`` and starting before ``until`` (microseconds)."""
        sql = f"""SELECT start_us, end_us, value, closed_at, revision FROM {self.states}
                  WHERE aggregation = ? AND key = ?"""
        params: list[Any] = [name, key]
        if since is not None:
            sql, params = sql + " AND end_us > ?", [*params, since]
        if until is not None:
            sql, params = sql + " AND start_us < ?", [*params, until]
        rows = self.db.query(self.db.sql(sql + " ORDER BY start_us"), params)
        return [WindowResult(key, s, e, decode(v), c is not None, r) for s, e, v, c, r in rows]

    def late(self, name: str, key: str | None = None) -> list[LateEvent]:
        sql = f"""SELECT position, key, t_us, windows, amended FROM {self.late_table}
                  WHERE aggregation = ?"""
        params: list[Any] = [name]
        if key is not None:
            sql, params = sql + " AND key = ?", [*params, key]
        rows = self.db.query(self.db.sql(sql + " ORDER BY position"), params)
        return [
            LateEvent(p, k, t, [(s, e) for s, e in json.loads(ws)], bool(a))
            for p, k, t, ws, a in rows
        ]


def encoded_rows(name: str, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Encoded windows (key, start, end, value text, closed_at, revision) as the states
    table's columns: (aggregation, key, start, end, routing hash, value, closed_at,
    revision)."""
    routing = stable_hashes([r[0] for r in rows])
    return [(name, k, s, e, h, v, c, r) for (k, s, e, v, c, r), h in
            zip(rows, routing, strict=True)]  # fmt: skip


def late_rows(name: str, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Late inputs (position, key, t, windows, amended, recorded_at) as the late table's
    columns (windows as JSON, amended as 0 or 1)."""
    return [(name, p, k, t, json.dumps(ws), int(a), r) for p, k, t, ws, a, r in rows]


class StagedWindows:
    """``with StagedWindows(table) as stage: stage.add(...); ... stage.move(conn, name)``:
    windows and late inputs computed elsewhere (a Spark replay's, encoded) staged in temporary
    tables of this thread's SQLite connection (a file of their own: no lock on the store, so
    the heartbeats' writes go on), then moved in by :meth:`move` inside the short
    transaction that replaces the states and moves the tokens
    (:meth:`.staging.StagedStates.replace`). A crash before leaves the store as it was."""

    def __init__(self, table: WindowTable) -> None:
        db = table.db
        if db.backend != "sqlite":
            raise ValueError("windows are staged on SQLite only")
        self.table, self.db = table, db
        self.windows = f"temp.{db.table('replay_windows')}"
        self.late = f"temp.{db.table('replay_late')}"

    def __enter__(self) -> StagedWindows:
        with self.db.connection() as conn:
            self._drop(conn)
            conn.execute(
                f"""CREATE TABLE {self.windows} (aggregation TEXT NOT NULL, key TEXT NOT NULL,
                    start_us INTEGER NOT NULL, end_us INTEGER NOT NULL, routing_hash INTEGER
                    NOT NULL, value TEXT NOT NULL, closed_at INTEGER, revision INTEGER NOT
                    NULL)"""
            )
            conn.execute(
                f"""CREATE TABLE {self.late} (aggregation TEXT NOT NULL, position INTEGER NOT
                    NULL, key TEXT NOT NULL, t_us INTEGER NOT NULL, windows TEXT NOT NULL,
                    amended INTEGER NOT NULL, recorded_at INTEGER NOT NULL)"""
            )
        return self

    def __exit__(self, *exc: object) -> None:
        with self.db.connection() as conn:
            if not conn.in_transaction:
                self._drop(conn)

    def _drop(self, conn: Any) -> None:
        for table in (self.windows, self.late):
            conn.execute(f"DROP TABLE IF EXISTS {table}")

    def add(self, name: str, windows: list[tuple[Any, ...]], late: list[tuple[Any, ...]]) -> None:
        """Stage windows (key, start, end, value text, closed_at, revision) and late inputs
        (position, key, t, windows, amended, recorded_at), in a transaction of the temporary
        file only."""
        with temporary_writes(self.db) as conn:
            conn.executemany(
                f"INSERT INTO {self.windows} VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                encoded_rows(name, windows),
            )
            conn.executemany(
                f"INSERT INTO {self.late} VALUES (?, ?, ?, ?, ?, ?, ?)", late_rows(name, late)
            )

    def move(self, conn: Any, name: str) -> None:
        """Inside the caller's transaction: the windows, late inputs and clock rows of
        ``name`` deleted, the staged ones inserted (in the tables' order). A window or late
        input staged twice fails the primary key: nothing is written."""
        t = self.table
        t.delete_all(conn, name)
        conn.execute(
            f"""INSERT INTO {t.states} (aggregation, key, start_us, end_us, routing_hash,
                value, closed_at, revision, updated_at) SELECT aggregation, key, start_us,
                end_us, routing_hash, value, closed_at, revision, {self.db.now_ms} FROM
                {self.windows} ORDER BY aggregation, key, start_us"""
        )
        conn.execute(
            f"""INSERT INTO {t.late_table} (aggregation, position, key, t_us, windows, amended,
                recorded_at) SELECT aggregation, position, key, t_us, windows, amended,
                recorded_at FROM {self.late} ORDER BY aggregation, position"""
        )
