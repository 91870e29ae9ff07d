"""A Spark 4 Python data source over an eventlanes store (SQLite file or PostgreSQL).

No PyPI package ships a SQLite JDBC driver, and one Python reader serves both backends, with
keyset pagination, as Arrow record batches. A batch read splits the positions ``(after, until]``
into contiguous ranges, one per partition: each reads only its own rows off the primary key.
Streaming offsets are store positions: a micro-batch reads ``(start, end]``, each partition one
routing-hash slice ``routing_hash & mask == i`` of it.

Options: ``url`` (store URL), ``after``/``until`` (batch reads), ``partitions`` (a power of
two), ``max_rows`` (streaming: most positions per micro-batch).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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
    store = open_store(url)
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

            self._store = open_store(self.url)
        return self._store.head()

    def initialOffset(self) -> dict:
        return {"position": self.start}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        head = self._head()
        begin = int((start or {}).get("position", self.start))
        cap = getattr(limit, "max_rows", None) or self.max_rows
        return {"position": min(head, begin + cap) if cap else head}

    def partitions(self, start: dict, end: dict) -> list[Slice]:  # type: ignore[override]
        return _slices(int(start["position"]), int(end["position"]), self.n)

    def read(self, partition: Slice) -> Iterator[Any]:  # type: ignore[override]
        yield from read_slice(self.url, partition)

    def commit(self, end: dict) -> None:
        pass  # the sink records progress in the database, with the states

    def stop(self) -> None:
        if self._store is not None:
            self._store.close()
