"""Schema version 2: what Kafka ingestors keep besides their tokens.

Table ``{prefix}kafka_partitions``, one row per (ingestor, partition): the topic (and its id,
to tell a deleted and recreated topic from the one read before) and the partition's offsets as
the ingestor last saw them on the broker. Positions live in ``{prefix}tokens`` (see
:mod:`eventlanes.kafka.schema`). Never change this module once released.
"""

from __future__ import annotations

from typing import Any

from ..db import Database


def apply(db: Database, conn: Any) -> None:
    conn.execute(
        f"""CREATE TABLE IF NOT EXISTS {db.table("kafka_partitions")} (
            ingestor TEXT NOT NULL,
            partition_id INTEGER NOT NULL,
            topic TEXT NOT NULL,
            topic_id TEXT,
            low_watermark BIGINT,
            high_watermark BIGINT,
            observed_at BIGINT,
            PRIMARY KEY (ingestor, partition_id))"""
    )
