"""Reading an eventlanes store (SQLite file or PostgreSQL) into Spark.

No PyPI package ships a SQLite JDBC driver, and one Python reader serves both backends: each
range is read into Arrow record batches (``scan_arrow``: PostgreSQL's binary COPY through its
ADBC driver; SQLite through Python's own library, the one the executor's writes use).
Executors open the store read-only.

Batch reads (:func:`read_events`) need no registered data source and no Python planning
process on the driver: the driver splits the positions ``(after, until]`` into contiguous
ranges, a DataFrame of one range per partition is built in the JVM, and ``mapInArrow`` reads
each range on an executor. What each range read travels as data: after its rows, a range
yields one count row (its index, rows read, chained types; the data's columns null), and the
read is kept by ``localCheckpoint``, so the plan and the count see the same rows, those of the
task attempt Spark kept (a retried or recomputed task cannot count twice, as a side channel's
sum would). No accumulator: the same code runs on classic and on Spark Connect sessions.

The streaming data source remains for Structured Streaming. Streaming offsets are store
positions: a micro-batch reads ``(start, end]``, each partition one
routing-hash slice ``routing_hash & mask == i`` of it.

Options: ``url`` (store URL), ``after``/``until`` (batch reads), ``partitions`` (a power of
two), ``max_rows`` (streaming: most positions per micro-batch).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

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


#: the columns a range read adds to its rows: null on the data's rows, set on each range's
#: count row (whose data columns are null)
COUNTS = ("read_range", "read_rows", "read_chained")
COUNT_SCHEMA = "read_range long, read_rows long, read_chained array<string>"


def merge_reads(reports: Iterable[tuple[int, Read]]) -> dict[int, Read | None]:
    """What was read per range: ``{range index: (rows, chained types)}``. A range reported
    twice replaces, never adds; two reports that disagree give None (never a valid total)."""
    merged: dict[int, Read | None] = {}
    for index, read in reports:
        merged[index] = None if merged.get(index, read) != read else read
    return merged


@dataclass
class ReadCount:
    """What a batch read read: compare with the store before writing anything. ``counts``:
    the count rows of the kept read (a DataFrame of ``COUNTS``), collected once, when first
    asked (after the plan ran: the read is kept, so this job reads no store)."""

    counts: Any
    ranges: int
    _merged: dict[int, Read | None] | None = field(default=None, repr=False)

    def merged(self) -> dict[int, Read | None]:
        if self._merged is None:
            rows = self.counts.collect()
            self._merged = merge_reads(
                (r[COUNTS[0]], (r[COUNTS[1]], tuple(r[COUNTS[2]] or ()))) for r in rows
            )
        return self._merged

    def _reads(self) -> list[Read] | None:
        counts = self.merged()
        if len(counts) != self.ranges or any(v is None for v in counts.values()):
            return None
        return [v for v in counts.values() if v is not None]

    def total(self) -> int | None:
        """Rows read, or None if a range was not read or two reads of it disagreed."""
        reads = self._reads()
        return None if reads is None else sum(rows for rows, _ in reads)

    def chained_types(self) -> set[str] | None:
        """The event types read whose metadata mention a source chain (None: not every range
        was read, or two reads disagreed)."""
        reads = self._reads()
        return None if reads is None else {t for _, types in reads for t in types}


def counted(batch: Any) -> Any:
    """A batch of the data with the count columns added, null."""
    import pyarrow as pa

    n = batch.num_rows
    extra = [pa.nulls(n, pa.int64()), pa.nulls(n, pa.int64()), pa.nulls(n, pa.list_(pa.string()))]
    return pa.RecordBatch.from_arrays([*batch.columns, *extra], names=[*batch.schema.names,
                                                                      *COUNTS])  # fmt: skip


def count_row(data: Any, index: int, rows: int, chained_types: Iterable[str] = ()) -> Any:
    """A range's count row: ``data`` (the data's Arrow schema) all null, the counts set."""
    import pyarrow as pa

    columns = [pa.nulls(1, f.type) for f in data]
    columns += [pa.array([index], pa.int64()), pa.array([rows], pa.int64()),
                pa.array([sorted(chained_types)], pa.list_(pa.string()))]  # fmt: skip
    return pa.RecordBatch.from_arrays(columns, names=[*data.names, *COUNTS])


def kept_read(raw: Any) -> tuple[Any, Any]:
    """The read's data and its count rows, both of one kept (locally checkpointed) read."""
    from pyspark.sql import functions as F

    kept = raw.localCheckpoint(eager=False)
    data = kept.where(F.col(COUNTS[0]).isNull()).drop(*COUNTS)
    return data, kept.where(F.col(COUNTS[0]).isNotNull()).select(*COUNTS)


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


def arrow_schema(shape: Declared | Keyed | None) -> Any:
    """The Arrow schema of what a read of ``shape`` yields (its Spark schema)."""
    import pyarrow as pa

    from ..store.arrow import schema

    if shape is None:
        return schema()
    if isinstance(shape, Keyed):
        return schema().append(pa.field("key", pa.string()))
    return shape.arrow_schema()


def _read_ranges(
    url: str,
    batches: Iterator[Any],
    shape: Declared | Keyed | None = None,
    upcasters: Upcasters | None = None,
) -> Iterator[Any]:
    # An upcaster is given the whole event: every column is read then.
    columns = None if shape is None or upcasters is not None else shape.columns
    data = arrow_schema(shape)
    for batch in batches:
        for index, after, until in zip(*(c.to_pylist() for c in batch.columns), strict=True):
            tally = _Tally()
            read = tally.count(read_slice(url, Slice(after, until), columns), upcasters)
            yield from map(counted, read if shape is None else shape.batches(read))
            yield count_row(data, index, tally.rows, tally.types)


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
    of rows the executors read (asked once the plan has run, it reads no store again: the
    read is kept). ``upcasters``: applied on the
    executors as each batch is read (old rows only, in Python), so the rest of the plan, native
    expressions included, sees current shapes."""
    from pyspark.sql import functions as F

    ranges = _ranges(after, until, partitions)
    k = len(ranges)
    bounds = spark.range(0, k, 1, k).select(
        F.col("id").alias("index"),
        F.element_at(F.array(*[F.lit(r.after) for r in ranges]), F.col("id").cast("int") + 1)
        .cast("long").alias("after"),
        F.element_at(F.array(*[F.lit(r.until) for r in ranges]), F.col("id").cast("int") + 1)
        .cast("long").alias("until"),
    )  # fmt: skip
    schema = (SCHEMA if shape is None else shape.schema) + ", " + COUNT_SCHEMA
    raw = bounds.mapInArrow(lambda it: _read_ranges(url, it, shape, upcasters), schema)
    df, counts = kept_read(raw)
    return df, ReadCount(counts, k)


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
