"""Reading an eventlanes store (SQLite file or PostgreSQL) into Spark.

No PyPI package ships a SQLite JDBC driver, and one Python reader serves both backends, with
keyset pagination, as Arrow record batches. Executors open the store read-only.

Batch reads (:func:`read_events`) need no registered data source and no Python planning
process on the driver: the driver splits the positions ``(after, until]`` into contiguous
ranges, a DataFrame of one range per partition is built in the JVM, and ``mapInArrow`` reads
each range on an executor, counting the rows it read (per range, so a retried task does not
count twice) for the caller to check against the store.

The streaming data source remains for Structured Streaming. Streaming offsets are store
positions: a micro-batch reads ``(start, end]``, each partition one
routing-hash slice ``routing_hash & mask == i`` of it.

Options: ``url`` (store URL), ``after``/``until`` (batch reads), ``partitions`` (a power of
two), ``max_rows`` (streaming: most positions per micro-batch).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.accumulators import AccumulatorParam
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

SCHEMA = (
    "position long, stream_id string, version long, type string, data string, "
    "metadata string, recorded_at long, routing_hash long"
)
FIELDS = ["position", "stream_id", "version", "type", "data", "metadata", "recorded_at",
          "routing_hash"]  # fmt: skip


class Slice(InputPartition):
    """Positions ``(after, until]``; with ``mask`` > 0 only ``routing_hash & mask == index``."""

    def __init__(self, after: int, until: int, index: int = 0, mask: int = 0) -> None:
        self.after, self.until, self.index, self.mask = after, until, index, mask


def arrow_batch(rows: list[tuple[Any, ...]]) -> Any:
    """Store rows (the columns of ``FIELDS``) as one Arrow record batch."""
    import pyarrow as pa

    # Declared types: letting Arrow infer them from Python lists costs 3x the conversion.
    types = [pa.int64(), pa.string(), pa.int64(), pa.string(), pa.string(), pa.string(),
             pa.int64(), pa.int64()]  # fmt: skip
    columns = zip(*rows, strict=True)
    arrays = [pa.array(col, type=t) for col, t in zip(columns, types, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, names=FIELDS)


def read_slice(url: str, part: Slice) -> Iterator[Any]:
    from ..store import open_store

    segments = [(part.index, part.mask)] if part.mask else None
    store = open_store(url, create=False)
    try:
        for rows in store.scan(part.after, part.until, segments, chunk=20_000):
            yield arrow_batch(rows)
    finally:
        store.close()


def _ranges(after: int, until: int, partitions: int) -> list[Slice]:
    """Contiguous position ranges of (nearly) equal width, at least one position each."""
    width = max(1, -(-(until - after) // partitions))
    bounds = list(range(after, until, width)) + [until]
    return [Slice(a, b) for a, b in zip(bounds, bounds[1:], strict=False)] or [Slice(after, until)]


class RangeCounts(AccumulatorParam):
    """Rows read per range: ``{range index: rows}``. A task that runs again (retry,
    speculation, a lost shuffle) reports the same range again: it replaces, never adds."""

    def zero(self, value: dict[int, int]) -> dict[int, int]:
        return {}

    def addInPlace(self, value1: dict[int, int], value2: dict[int, int]) -> dict[int, int]:
        for index, rows in value2.items():
            if value1.get(index, rows) != rows:
                value1[index] = -1  # two reads of one range disagree: never a valid total
            else:
                value1[index] = rows
        return value1


@dataclass
class ReadCount:
    """What a batch read read: compare with the store before writing anything."""

    accumulator: Any
    ranges: int

    def total(self) -> int | None:
        """Rows read, or None if a range was not read or two reads of it disagreed."""
        counts = self.accumulator.value
        if len(counts) != self.ranges or any(v < 0 for v in counts.values()):
            return None
        return sum(counts.values())


def _read_ranges(url: str, counter: Any, batches: Iterator[Any]) -> Iterator[Any]:
    for batch in batches:
        for index, after, until in zip(*(c.to_pylist() for c in batch.columns), strict=True):
            rows = 0
            for out in read_slice(url, Slice(after, until)):
                rows += out.num_rows
                yield out
            counter.add({index: rows})


def read_events(
    spark: Any, url: str, after: int, until: int, partitions: int
) -> tuple[Any, ReadCount]:
    """The events in positions ``(after, until]`` as a DataFrame of ``SCHEMA``, one range per
    partition, and the count of rows the executors read (valid once the plan has run)."""
    from pyspark.sql import functions as F

    ranges = _ranges(after, until, partitions)
    counter = spark.sparkContext.accumulator({}, RangeCounts())
    k = len(ranges)
    bounds = spark.range(0, k, 1, k).select(
        F.col("id").alias("index"),
        F.element_at(F.array(*[F.lit(r.after) for r in ranges]), F.col("id").cast("int") + 1)
        .cast("long").alias("after"),
        F.element_at(F.array(*[F.lit(r.until) for r in ranges]), F.col("id").cast("int") + 1)
        .cast("long").alias("until"),
    )  # fmt: skip
    df = bounds.mapInArrow(lambda it: _read_ranges(url, counter, it), SCHEMA)
    return df, ReadCount(counter, k)


def _slices(after: int, until: int, partitions: int) -> list[Slice]:
    return [Slice(after, until, i, partitions - 1) for i in range(partitions)]


class StoreDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "eventlanes"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return StoreReader(dict(self.options))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return StoreStreamReader(dict(self.options))


def _partitions(options: dict[str, str]) -> int:
    n = int(options.get("partitions", "2"))
    if n < 1 or n & (n - 1):
        raise ValueError(f"partitions must be a power of two, got {n}")
    return n


class StoreReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.url = options["url"]
        self.after = int(options.get("after", "0"))
        self.until = int(options["until"])
        self.n = _partitions(options)

    def partitions(self) -> list[Slice]:
        return _ranges(self.after, self.until, self.n)

    def read(self, partition: Slice) -> Iterator[Any]:  # type: ignore[override]
        yield from read_slice(self.url, partition)


class StoreStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.url = options["url"]
        self.n = _partitions(options)
        self.start = int(options.get("after", "0"))
        self.max_rows = int(options.get("max_rows", "0")) or None
        self._store: Any = None

    def _head(self) -> int:
        if self._store is None:
            from ..store import open_store

            self._store = open_store(self.url, create=False)
        return self._store.head()

    def initialOffset(self) -> dict:
        return {"position": self.start}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        head = self._head()
        begin = int((start or {}).get("position", self.start))
        cap = getattr(limit, "max_rows", None) or self.max_rows
        return {"position": min(head, begin + cap) if cap else head}

    def partitions(self, start: dict, end: dict) -> list[Slice]:
        return _slices(int(start["position"]), int(end["position"]), self.n)

    def read(self, partition: Slice) -> Iterator[Any]:  # type: ignore[override]
        yield from read_slice(self.url, partition)

    def commit(self, end: dict) -> None:
        pass  # the sink records progress in the database, with the states

    def stop(self) -> None:
        if self._store is not None:
            self._store.close()
