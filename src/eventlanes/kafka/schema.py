"""The one table this package adds (created by schema migration 2, ``schema/v2_kafka.py``).

Table ``{prefix}kafka_partitions``, one row per (ingestor, partition): which topic (and topic
id, to tell a deleted and recreated topic from the one read before) and the partition's
offsets as the ingestor last saw them on the broker. Positions are not here: a partition's
position (the next offset to read) is its token row in ``{prefix}tokens`` (processor = the
ingestor, segment id = the partition), claimed, extended and fenced like a segment's.

| column | meaning |
|---|---|
| ingestor, partition_id | primary key |
| topic, topic_id | the topic, and its id when the broker gives one |
| low_watermark, high_watermark | the partition's first and next offsets, as last fetched |
| observed_at | when they were fetched (epoch ms, the database's clock) |
"""

from __future__ import annotations

from ..db import Database
from ..schema import require


def partitions_table(db: Database) -> str:
    return db.table("kafka_partitions")


def ensure(db: Database) -> None:
    """The table is schema version 2 (:mod:`eventlanes.schema.v2_kafka`): checked (and
    migrated where the role may) like every other part."""
    require(db, "kafka")


def exists(db: Database, table: str | None = None) -> bool:
    """Whether the table (by default ``kafka_partitions``) exists: a plain read."""
    table = table or partitions_table(db)
    if db.backend == "sqlite":
        sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
        return bool(db.query(sql, (table,)))
    return bool(db.query("SELECT to_regclass(%s) IS NOT NULL", (table,))[0][0])
