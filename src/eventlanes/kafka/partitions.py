"""A topic's partitions as rows: the token row of each (processor = the ingestor, segment id =
the partition, claimed and fenced like a segment) and what the ingestor saw of it on the broker.

A partition row uses the widest mask, so that its segment is valid and never split or merged:
nothing routes by it. Its position is the next offset to append (the number of records of
the partition appended so far, when offsets start at 0): caught up means position == the
broker's high watermark.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..db import Database
from ..errors import InvalidInputError
from ..segments import MAX_MASK, Segment
from . import schema

MASK = MAX_MASK
#: dead letters of an ingestor are keyed by (partition, offset) packed in one number
OFFSET_BITS = 48
MAX_PARTITION = 2**15 - 1


def segment(partition: int) -> Segment:
    return Segment(partition, MASK)


def pack(partition: int, offset: int) -> int:
    """The dead-letter ``position`` of a parked record."""
    if not 0 <= partition <= MAX_PARTITION or not 0 <= offset < 2**OFFSET_BITS:
        raise InvalidInputError(f"partition {partition} offset {offset} cannot be parked")
    return (partition << OFFSET_BITS) | offset


def unpack(position: int) -> tuple[int, int]:
    return position >> OFFSET_BITS, position & (2**OFFSET_BITS - 1)


@dataclass(frozen=True, slots=True)
class Seen:
    """What the ingestor last saw of a partition on the broker."""

    partition: int
    topic: str
    topic_id: str | None
    low: int | None
    high: int | None
    observed_at: float | None  # epoch seconds


class PartitionTable:
    def __init__(self, db: Database, create: bool = True) -> None:
        self.db = db
        self.table = schema.partitions_table(db)
        if create:
            schema.ensure(db)

    def add(self, ingestor: str, topic: str, partitions: list[int], topic_id: str | None) -> None:
        q = self.db.sql
        sql = q(
            f"INSERT INTO {self.table} (ingestor, partition_id, topic, topic_id) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (ingestor, partition_id) DO NOTHING"
        )
        with self.db.transaction() as conn:
            for p in partitions:
                conn.execute(sql, (ingestor, p, topic, topic_id))

    def set_topic_id(self, conn: Any, ingestor: str, partition: int, topic_id: str | None) -> None:
        conn.execute(
            self.db.sql(
                f"UPDATE {self.table} SET topic_id = ? WHERE ingestor = ? AND partition_id = ?"
            ),
            (topic_id, ingestor, partition),
        )

    def observe(self, ingestor: str, marks: dict[int, tuple[int, int]]) -> None:
        """Record the watermarks fetched for these partitions."""
        sql = self.db.sql(
            f"UPDATE {self.table} SET low_watermark = ?, high_watermark = ?, "
            f"observed_at = {self.db.now_ms} WHERE ingestor = ? AND partition_id = ?"
        )
        with self.db.transaction() as conn:
            for p, (low, high) in marks.items():
                conn.execute(sql, (low, high, ingestor, p))

    def seen(self, ingestor: str) -> dict[int, Seen]:
        sql = self.db.sql(
            f"SELECT partition_id, topic, topic_id, low_watermark, high_watermark, observed_at "
            f"FROM {self.table} WHERE ingestor = ? ORDER BY partition_id"
        )
        return {
            r[0]: Seen(r[0], r[1], r[2], r[3], r[4], None if r[5] is None else r[5] / 1000)
            for r in self.db.query(sql, (ingestor,))
        }

    def ingestors(self) -> list[str]:
        rows = self.db.query(f"SELECT DISTINCT ingestor FROM {self.table} ORDER BY ingestor")
        return [r[0] for r in rows]
