"""A bulk read of a Kafka topic into Spark, by offset ranges, with the Kafka client on the
executors (no spark-sql-kafka jar): the driver plans ``[start, end)`` ranges per partition
(from the broker's first offsets and the high watermarks its fetch responses report), a
DataFrame of one range per Spark partition is built in the JVM, and ``mapInArrow`` reads each
range with confluent-kafka, counting what it read as data (a count row per range, the read
kept by ``localCheckpoint``: the count is that of the rows Spark kept, a retried task cannot
count twice), as ``spark/source.py`` reads the store.

``read_topic(spark, kafka, topic)`` returns the records (``topic, partition, offset,
timestamp, key, value, headers``: headers as a JSON object of UTF-8 text) and a
:class:`TopicRead`; call ``read.verify()`` after the plan ran and before using what it
produced (a replay's states, an export's files): it raises unless every range was read to its
end and the records read add up to the offsets planned. A topic written with transactions
(whose markers take offsets) or compacted has fewer records than offsets and fails the check,
naming the ranges.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import SparkJobError
from ..kafka import client
from ..kafka.settings import Kafka
from .source import COUNT_SCHEMA, COUNTS, count_row, counted, kept_read, merge_reads

SCHEMA = (
    "topic string, partition int, offset long, timestamp long, key binary, value binary, "
    "headers string"
)
FIELDS = ["topic", "partition", "offset", "timestamp", "key", "value", "headers"]
#: a range not read to its end within this many seconds without a record fails the task
IDLE_TIMEOUT = 30.0


@dataclass(frozen=True)
class Range:
    index: int
    partition: int
    start: int
    end: int  # exclusive


def plan(kafka: Kafka, topic: str, max_records: int, timeout: float = 30.0) -> list[Range]:
    """Ranges of at most ``max_records`` offsets covering each partition's records now."""
    ck = client.client_module()
    admin = client.admin(kafka)
    partitions = client.describe(kafka, topic, admin, kafka.timeout).partitions
    consumer = client.consumer(kafka)
    try:
        lows = {p: client.low_watermark(consumer, topic, p, kafka.timeout) for p in partitions}
        # The high watermark as a fetch reports it (ListOffsets latest can be short of it on
        # some brokers: Tansu's answers the last batch's base offset + 1).
        consumer.assign([ck.TopicPartition(topic, p, max(0, lows[p])) for p in partitions])
        highs: dict[int, int] = {}
        deadline = time.monotonic() + timeout
        while len(highs) < len(partitions):
            if time.monotonic() > deadline:
                missing = sorted(set(partitions) - set(highs))
                raise SparkJobError(f"no high watermark of {topic} partitions {missing} within "
                                    f"{timeout:g} s")  # fmt: skip
            consumer.consume(1000, timeout=0.1)
            for p in partitions:
                _low, high = consumer.get_watermark_offsets(
                    ck.TopicPartition(topic, p), cached=True
                )
                if high >= 0:
                    highs[p] = high
    finally:
        consumer.close()
    ranges: list[Range] = []
    for p in partitions:
        start = max(0, lows[p])
        while start < highs[p]:
            end = min(highs[p], start + max_records)
            ranges.append(Range(len(ranges), p, start, end))
            start = end
    return ranges


def _batch(rows: list[tuple[Any, ...]]) -> Any:
    import pyarrow as pa

    types = [pa.string(), pa.int32(), pa.int64(), pa.int64(), pa.binary(), pa.binary(),
             pa.string()]  # fmt: skip
    columns: list[Any] = list(zip(*rows, strict=True)) if rows else [() for _ in FIELDS]
    arrays = [pa.array(list(c), type=t) for c, t in zip(columns, types, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, names=FIELDS)


def _headers(message: Any) -> str:
    out: dict[str, Any] = {}
    for key, raw in message.headers() or ():
        out[key] = None if raw is None else raw.decode("utf-8", errors="replace")
    return json.dumps(out, separators=(",", ":"))


def read_range(config: dict[str, Any], topic: str, r: Range, chunk: int = 20_000) -> Iterator[Any]:
    """The records of ``r`` as Arrow batches; raises if the range cannot be read to its end."""
    ck = client.client_module()
    consumer: Any = ck.Consumer(config)
    try:
        consumer.assign([ck.TopicPartition(topic, r.partition, r.start)])
        rows: list[tuple[Any, ...]] = []
        position = r.start
        idle_since = time.monotonic()
        while position < r.end:
            messages: list[Any] = consumer.consume(min(chunk, r.end - position), timeout=0.5)
            if not messages:
                tp = ck.TopicPartition(topic, r.partition)
                [pos] = consumer.position([tp])
                position = max(position, pos.offset)
                _low, high = consumer.get_watermark_offsets(tp, cached=True)
                if 0 <= high <= position < r.end:
                    break  # the broker has no more: the count falls short, verify() says so
                if time.monotonic() - idle_since > IDLE_TIMEOUT:
                    raise RuntimeError(
                        f"{topic}[{r.partition}]: no record at offset {position} within "
                        f"{IDLE_TIMEOUT:g} s (range {r.start}..{r.end})"
                    )
                continue
            idle_since = time.monotonic()
            for m in messages:
                if m.error() is not None:
                    raise RuntimeError(f"{topic}[{r.partition}]: {m.error().str()}")
                if m.offset() >= r.end:
                    position = r.end
                    break
                kind, ts = m.timestamp()
                rows.append((topic, r.partition, m.offset(), ts if kind else None, m.key(),
                             m.value(), _headers(m)))  # fmt: skip
                position = m.offset() + 1
            if len(rows) >= chunk:
                yield _batch(rows)
                rows = []
        if rows:
            yield _batch(rows)
    finally:
        consumer.close()


@dataclass
class TopicRead:
    """What a topic read read: check it with :meth:`verify` before using what it produced."""

    topic: str
    ranges: list[Range]
    counts: Any  # the count rows of the kept read (None: nothing planned)
    _merged: dict[int, int] | None = field(default=None, repr=False)

    def merged(self) -> dict[int, int]:
        """Records read per range index (-1: two reads of a range disagreed)."""
        if self._merged is None:
            rows = [] if self.counts is None else self.counts.collect()
            reads = merge_reads((r[COUNTS[0]], (r[COUNTS[1]], ())) for r in rows)
            self._merged = {i: -1 if v is None else v[0] for i, v in reads.items()}
        return self._merged

    @property
    def planned(self) -> int:
        return sum(r.end - r.start for r in self.ranges)

    def total(self) -> int | None:
        """Records read, or None when a range was not read (or two reads of it disagree)."""
        counts = self.merged()
        if len(counts) != len(self.ranges) or any(v < 0 for v in counts.values()):
            return None
        return sum(counts.values())

    def verify(self) -> int:
        """The records read; raises SparkJobError unless they are exactly what was planned."""
        counts = self.merged()
        unread = [r for r in self.ranges if r.index not in counts]
        short = [r for r in self.ranges if counts.get(r.index, r.end - r.start) != r.end - r.start]
        if unread or short:
            what = ", ".join(
                f"partition {r.partition} offsets {r.start}..{r.end}: "
                + ("not read" if r.index not in counts else f"{counts[r.index]} record(s)")
                for r in (unread + short)[:5]
            )
            raise SparkJobError(f"reading topic {self.topic!r} fell short of the offsets "
                                f"planned ({what}); nothing read may be used")  # fmt: skip
        return self.planned


def _read(config: dict[str, Any], topic: str, batches: Iterator[Any]) -> Iterator[Any]:
    data = _batch([]).schema
    for batch in batches:
        for index, partition, start, end in zip(*(c.to_pylist() for c in batch.columns),
                                                strict=True):  # fmt: skip
            rows = 0
            for out in read_range(config, topic, Range(index, partition, start, end)):
                rows += out.num_rows
                yield counted(out)
            yield count_row(data, index, rows)


def read_topic(
    spark: Any,
    kafka: Kafka,
    topic: str,
    *,
    max_records: int = 200_000,
    ranges: list[Range] | None = None,
) -> tuple[Any, TopicRead]:
    """The topic's records now (or those of ``ranges``) as a DataFrame of ``SCHEMA``, one
    offset range (at most ``max_records``) per Spark partition, and what was read."""
    from pyspark.sql import functions as F

    planned = ranges if ranges is not None else plan(kafka, topic, max_records)
    config = kafka.consumer_config()  # executors connect with the same options
    if not planned:
        empty = spark.createDataFrame([], SCHEMA)
        return empty, TopicRead(topic, [], None)
    k = len(planned)

    def column(values: list[int], name: str) -> Any:
        return (F.element_at(F.array(*[F.lit(v) for v in values]), F.col("id").cast("int") + 1)
                .cast("long").alias(name))  # fmt: skip

    bounds = spark.range(0, k, 1, k).select(
        F.col("id").alias("index"),
        column([r.partition for r in planned], "partition"),
        column([r.start for r in planned], "start"),
        column([r.end for r in planned], "end"),
    )
    raw = bounds.mapInArrow(lambda it: _read(config, topic, it), f"{SCHEMA}, {COUNT_SCHEMA}")
    df, counts = kept_read(raw)
    return df, TopicRead(topic, planned, counts)
