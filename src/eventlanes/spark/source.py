"""Reading an eventlanes store (SQLite file or PostgreSQL) into Spark.

No PyPI package ships a SQLite JDBC driver, and one Python reader serves both backends: each
range is read into Arrow record batches (``scan_arrow``: PostgreSQL's binary COPY through its
ADBC driver; SQLite through Python's own library, the one the executor's writes use).
Executors open the store read-only.

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

from ..columnar.fold import Field
from ..upcasting import Upcasters
from ..upcasting.arrow import upcast_batch

SCHEMA = (
    "position long, stream_id string, version long, type string, data string, "
    "metadata string, recorded_at long, routing_hash long"
)
PREFIX = "data_"  # typed data columns: data_<property> (as in Parquet exports)
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


def read_slice(url: str, part: Slice, columns: list[str] | None = None) -> Iterator[Any]:
    from ..store import open_store

    segments = [(part.index, part.mask)] if part.mask else None
    store = open_store(url, create=False)
    try:
        # Into Arrow batches, read-only.
        yield from store.scan_arrow(part.after, part.until, segments, columns=columns)
    finally:
        store.close()


def _ranges(after: int, until: int, partitions: int) -> list[Slice]:
    """Contiguous position ranges of (nearly) equal width, at least one position each."""
    width = max(1, -(-(until - after) // partitions))
    bounds = list(range(after, until, width)) + [until]
    return [Slice(a, b) for a, b in zip(bounds, bounds[1:], strict=False)] or [Slice(after, until)]


#: what an executor reports of one range: rows read, and the event types whose metadata
#: mention a source chain (a declarative plan needs the chain's window only for those)
Read = tuple[int, tuple[str, ...]]


class RangeCounts(AccumulatorParam):
    """What was read per range: ``{range index: (rows, chained types)}``. A task that runs
    again (retry, speculation, a lost shuffle) reports the same range again: it replaces,
    never adds."""

    def zero(self, value: dict[int, Read | None]) -> dict[int, Read | None]:
        return {}

    def addInPlace(
        self, value1: dict[int, Read | None], value2: dict[int, Read | None]
    ) -> dict[int, Read | None]:
        for index, read in value2.items():
            if value1.get(index, read) != read:
                value1[index] = None  # two reads of one range disagree: never a valid total
            else:
                value1[index] = read
        return value1


@dataclass
class ReadCount:
    """What a batch read read: compare with the store before writing anything."""

    accumulator: Any
    ranges: int

    def _reads(self) -> list[Read] | None:
        counts = self.accumulator.value
        if len(counts) != self.ranges or any(v is None for v in counts.values()):
            return None
        return list(counts.values())

    def total(self) -> int | None:
        """Rows read, or None if a range was not read or two reads of it disagreed."""
        reads = self._reads()
        return None if reads is None else sum(rows for rows, _ in reads)

    def chained_types(self) -> set[str] | None:
        """The event types read whose metadata mention a source chain (None: not every range
        was read, or two reads disagreed)."""
        reads = self._reads()
        return None if reads is None else {t for _, types in reads for t in types}


def chained(batch: Any) -> set[str]:
    """The types of a batch's events whose metadata mention a source chain (in C)."""
    import pyarrow.compute as pc

    mentions = pc.match_substring(batch.column("metadata"), '"source_chain"')
    if not pc.any(mentions).as_py():
        return set()
    return set(pc.unique(pc.filter(batch.column("type"), mentions)).to_pylist())


@dataclass(frozen=True)
class Declared:
    """What a declarative plan reads of each event: its position and type, the declared data
    properties as typed columns (``data_<name>``: parsed in C where exact, see
    :mod:`eventlanes.columnar.json`; ``typed`` says so per row, else ``data`` is kept for
    Spark's parser) and metadata only where it mentions a source chain. Rows of every type
    stay (the plan counts what it read); other types carry no data.

    ``fields`` (the declaration's ``(kind, property, where)`` per state field, and ``key``):
    the executors fold what they read first (see :meth:`partials`), and rows carry partials
    (``events`` not null) or are events as above (``events`` null) that Spark folds itself."""

    kinds: dict[str, str]  # property -> Spark type, as declared
    folded: tuple[str, ...]  # the event types folded
    fields: tuple[Field, ...] = ()
    key: str = ""
    #: events folded by the executors at a time, at most (and their texts' bytes): the
    #: memory a task holds, and how few rows go on to Spark's shuffle
    chunk_rows: int = 1_000_000
    chunk_bytes: int = 64 << 20
    columns = ["position", "type", "data", "metadata"]  # what it reads of the store

    @property
    def schema(self) -> str:
        """The rows' Spark schema (of :meth:`arrow_schema`)."""
        from ..columnar.json import SPARK

        return ", ".join(f"`{f.name}` {SPARK[str(f.type)]}" for f in self.arrow_schema())

    def arrow_schema(self) -> Any:
        """The columns read, ``typed``, the declared properties and the partials' columns."""
        import pyarrow as pa

        from ..columnar.json import ARROW
        from ..store.arrow import schema

        read = schema()
        out = [read.field(c) for c in self.columns] + [pa.field("typed", pa.bool_())]
        out += [pa.field(PREFIX + p, getattr(pa, ARROW[k])()) for p, k in self.kinds.items()]
        for j, (kind, prop, _) in enumerate(self.fields):
            spark = "long" if kind == "count" else self.kinds[prop or ""]
            out.append(pa.field(f"f{j}", getattr(pa, ARROW[spark])()))
            if kind in ("first", "last"):
                out.append(pa.field(f"at{j}", pa.int64()))
        return pa.schema(out + ([pa.field("events", pa.int64())] if self.fields else []))

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        from ..columnar.json import ARROW, declared

        n = batch.num_rows
        ok = pc.is_in(batch.column("type"), value_set=pa.array(self.folded, pa.string()))
        every = pc.all(ok).as_py()
        texts = batch.column("data") if every else batch.column("data").filter(ok)
        found = declared(texts, self.kinds) if len(texts) else {}
        arrays = []
        for p, k in self.kinds.items():
            type_ = getattr(pa, ARROW[k])()
            value = (found or {}).get(p)
            if value is None:
                arrays.append(pa.nulls(n, type_))
            elif every:
                arrays.append(value)
            else:
                arrays.append(pc.replace_with_mask(pa.nulls(n, type_), ok, value))
        if found is None:  # Spark parses these rows' data (and raises what it must)
            data = pc.if_else(ok, batch.column("data"), pa.scalar(None, pa.string()))
        else:
            data = pa.nulls(n, pa.string())
        meta = batch.column("metadata")
        meta = pc.if_else(pc.match_substring(meta, '"source_chain"'), meta,
                          pa.scalar(None, pa.string()))  # fmt: skip
        given = {
            "position": batch.column("position"),
            "type": batch.column("type"),
            "data": data,
            "metadata": meta,
            "typed": pa.repeat(found is not None, n),
        }
        given |= {PREFIX + p: a for p, a in zip(self.kinds, arrays, strict=True)}
        return self._rows(given, n)  # the partials' columns null: events for Spark to fold

    def batches(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The rows of a range's batches (in position order), as the plan reads them."""
        if not self.fields:
            yield from map(self, batches)
            return
        yield from self.partials(batches)

    def partials(self, batches: Iterator[Any]) -> Iterator[Any]:
        """Each chunk of batches folded per key in C (:func:`eventlanes.columnar.fold.partials`):
        one row per key and one for the events of other types (a null key: only counted).
        A batch whose folded events cannot be read exactly (a value of another type, a key
        missing, JSON read differently) goes to Spark as events, as do a chunk's events when
        their fold is not exact: Spark then raises what it must, naming the event."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from ..columnar.json import declared

        folded = pa.array(self.folded, pa.string())
        held: list[tuple[Any, Any, dict[str, Any], int]] = []  # batch, positions, found, others
        rows = size = 0
        for batch in batches:
            ok = pc.is_in(batch.column("type"), value_set=folded)
            texts = batch.column("data").filter(ok)
            found = declared(texts, self.kinds) if len(texts) else {}
            if found is None or (found and found[self.key].null_count):
                yield self(batch)
                continue
            positions = batch.column("position").filter(ok)
            held.append((batch, positions, found, batch.num_rows - len(positions)))
            rows, size = rows + batch.num_rows, size + batch.column("data").nbytes
            if rows >= self.chunk_rows or size >= self.chunk_bytes:
                yield from self._fold(held)
                held, rows, size = [], 0, 0
        if held:
            yield from self._fold(held)

    def _fold(self, held: list[tuple[Any, Any, dict[str, Any], int]]) -> Iterator[Any]:
        import pyarrow as pa

        from ..columnar.fold import partials

        kept = [(p, f) for _, p, f, _ in held if len(p)]
        table = None
        if kept:
            found = {prop: pa.concat_arrays([f[prop] for _, f in kept]) for prop in self.kinds}
            positions = pa.concat_arrays([p for p, _ in kept])
            table = partials(found[self.key], positions, found, list(self.fields))
            if table is None:  # not exact: Spark folds these events
                yield from (self(batch) for batch, _, _, _ in held)
                return
        others = sum(o for _, _, _, o in held)
        if table is not None and table.num_rows:
            k = table.num_rows
            given = {c: table.column(c) for c in table.column_names}  # events, f<j>, at<j>
            given |= {
                "position": table.column("last"),
                PREFIX + self.key: table.column("key"),
                "type": pa.repeat(self.folded[0], k),
                "typed": pa.repeat(True, k),
            }
            yield self._rows(given, k)
        if others:  # type "": not folded, so the plan only counts them
            yield self._rows({"type": pa.array([""]), "typed": pa.array([True]),
                              "events": pa.array([others], pa.int64())}, 1)  # fmt: skip

    def _rows(self, given: dict[str, Any], n: int) -> Any:
        import pyarrow as pa

        schema = self.arrow_schema()
        columns = []
        for f in schema:
            col = given.get(f.name)
            if isinstance(col, pa.ChunkedArray):
                col = col.combine_chunks()
            columns.append(pa.nulls(n, f.type) if col is None else col.cast(f.type))
        return pa.RecordBatch.from_arrays(columns, schema=schema)


@dataclass(frozen=True)
class Keyed:
    """What a Python fold keyed by a data property reads: the events of the types it folds,
    with their ``key`` where the property is a string read exactly in C (see
    :mod:`eventlanes.columnar.json`), else null: Spark extracts it from the JSON then."""

    field: str  # the key's data property
    folded: tuple[str, ...]  # the event types folded
    columns = None  # every column: the fold is given whole events
    schema = SCHEMA + ", key string"

    def batches(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc

        from ..columnar.json import declared

        folded = pa.array(self.folded, pa.string())
        for batch in batches:
            ok = pc.is_in(batch.column("type"), value_set=folded)
            if not pc.all(ok).as_py():
                batch = batch.filter(ok)
            if not batch.num_rows:
                continue
            found = declared(batch.column("data"), {self.field: "string"})
            key = pa.nulls(batch.num_rows, pa.string()) if found is None else found[self.field]
            yield pa.RecordBatch.from_arrays([*batch.columns, key], names=[*FIELDS, "key"])


def _read_ranges(
    url: str,
    counter: Any,
    batches: Iterator[Any],
    shape: Declared | Keyed | None = None,
    upcasters: Upcasters | None = None,
) -> Iterator[Any]:
    # An upcaster is given the whole event: every column is read then.
    columns = None if shape is None or upcasters is not None else shape.columns
    for batch in batches:
        for index, after, until in zip(*(c.to_pylist() for c in batch.columns), strict=True):
            tally = _Tally()
            read = tally.count(read_slice(url, Slice(after, until), columns), upcasters)
            yield from read if shape is None else shape.batches(read)
            counter.add({index: (tally.rows, tuple(sorted(tally.types)))})


class _Tally:
    """What a range's read gave: rows, and the types with chained events (as read)."""

    def __init__(self) -> None:
        self.rows, self.types = 0, set[str]()

    def count(self, batches: Iterator[Any], upcasters: Upcasters | None) -> Iterator[Any]:
        for out in batches:
            self.rows += out.num_rows
            if upcasters is not None:  # current shapes before anything reads the data
                out = upcast_batch(upcasters, out)
            self.types |= chained(out)
            yield out


def read_events(
    spark: Any,
    url: str,
    after: int,
    until: int,
    partitions: int,
    shape: Declared | Keyed | None = None,
    upcasters: Upcasters | None = None,
) -> tuple[Any, ReadCount]:
    """The events in positions ``(after, until]`` as a DataFrame of ``SCHEMA`` (or of
    ``shape.schema``: what a declarative plan reads), one range per partition, and the count
    of rows the executors read (valid once the plan has run). ``upcasters``: applied on the
    executors as each batch is read (old rows only, in Python), so the rest of the plan, native
    expressions included, sees current shapes."""
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
    schema = SCHEMA if shape is None else shape.schema
    df = bounds.mapInArrow(lambda it: _read_ranges(url, counter, it, shape, upcasters), schema)
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
