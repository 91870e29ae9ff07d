"""Dead letters: events parked, in order, behind a failure of their sequence key.

Table ``{prefix}dead_letters``: (processor, position) primary key, the sequence key and its
routing hash, the stream id and version, the event type, the error and when it was parked.
Parking happens in the same transaction as the rest of the segment's batch and its token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...db import Database
from ...errors import InvalidInputError
from ...events import Event
from ...schema import require


@dataclass(frozen=True, slots=True)
class DeadLetter:
    processor: str
    position: int
    seq_key: str | None
    routing_hash: int
    stream_id: str
    version: int
    type: str
    error: str
    attempts: int
    parked_at: float
    #: a replay (after a reset) when it was parked: retried as one (schema version 6)
    replay: bool = False


class DeadLetterStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.table = db.table("dead_letters")
        require(db, "dead_letters")  # the table: eventlanes.schema.v1_initial

    def park(
        self,
        conn: Any,
        processor: str,
        event: Event,
        key: str | None,
        routing_hash: int,
        error: str,
        replay: bool = False,
    ) -> None:
        if key is not None and "\x00" in key:  # SQLite would store it, PostgreSQL refuse it
            raise InvalidInputError(
                f"{processor!r}: cannot park the event at position {event.position} (stream "
                f"{event.stream_id!r}, type {event.type!r}): its key {key!r} contains a NUL "
                "character, which cannot be stored"
            )
        conn.execute(
            self.db.sql(
                f"""INSERT INTO {self.table} (processor, position, seq_key, routing_hash, stream_id,
                    version, event_type, error, parked_at, replay)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, {self.db.now_ms}, ?)"""
            ),
            (processor, event.position, key, routing_hash, event.stream_id, event.version,
             event.type, error[:4000], int(replay)),
        )  # fmt: skip

    def parked_keys(self, processor: str) -> list[tuple[str, int]]:
        """(key, routing hash) of every key with parked events (key-less events excluded)."""
        sql = self.db.sql(
            f"SELECT DISTINCT seq_key, routing_hash FROM {self.table} "
            "WHERE processor = ? AND seq_key IS NOT NULL"
        )
        return [(r[0], r[1]) for r in self.db.query(sql, (processor,))]

    def list(
        self, processor: str, key: str | None = None, position: int | None = None
    ) -> list[DeadLetter]:
        """The processor's dead letters in position order; only those of sequence key ``key``
        and/or the one at ``position`` when given."""
        where, params = _filter(processor, key, position)
        sql = self.db.sql(
            f"""SELECT processor, position, seq_key, routing_hash, stream_id, version, event_type,
                    error, attempts, parked_at, replay FROM {self.table}
                WHERE {where} ORDER BY position"""
        )
        return [
            DeadLetter(*row[:9], row[9] / 1000, bool(row[10]))  # type: ignore[call-arg]
            for row in self.db.query(sql, params)
        ]

    def count(self, processor: str, key: str | None = None) -> int:
        where, params = _filter(processor, key, None)
        sql = self.db.sql(f"SELECT count(*) FROM {self.table} WHERE {where}")
        return int(self.db.query(sql, params)[0][0])

    def delete(self, conn: Any, processor: str, positions: Sequence[int]) -> None:
        sql = self.db.sql(f"DELETE FROM {self.table} WHERE processor = ? AND position = ?")
        for position in positions:
            conn.execute(sql, (processor, position))

    def record_failure(self, processor: str, position: int, error: str) -> None:
        sql = self.db.sql(
            f"UPDATE {self.table} SET error = ?, attempts = attempts + 1 "
            "WHERE processor = ? AND position = ?"
        )
        with self.db.transaction() as conn:
            conn.execute(sql, (error[:4000], processor, position))

    def clear(self, conn: Any, processor: str) -> None:
        conn.execute(self.db.sql(f"DELETE FROM {self.table} WHERE processor = ?"), (processor,))


def _filter(processor: str, key: str | None, position: int | None) -> tuple[str, tuple[Any, ...]]:
    if key is not None and not isinstance(key, str):
        raise InvalidInputError(f"a dead-letter key is a string, got {key!r}")
    if position is not None and (
        isinstance(position, bool) or not isinstance(position, int) or position < 1
    ):
        raise InvalidInputError(f"a dead-letter position is an integer >= 1, got {position!r}")
    where = "processor = ?"
    params: list[Any] = [processor]
    if key is not None:
        where += " AND seq_key = ?"
        params.append(key)
    if position is not None:
        where += " AND position = ?"
        params.append(position)
    return where, tuple(params)
