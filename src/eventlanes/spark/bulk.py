"""Bulk replay on Spark: ``el.spark.replay(app, name, spark=session)``.

The processor (or aggregation) must be stopped everywhere: the replay holds every segment's
claim for its whole run (extended by a heartbeat), reads the store up to its head ``E`` in
parallel, routes with the local engine's stable hash (``F.crc32`` of the key), keeps per-key
order (sorted by position within each key) and folds with the user's own code on Arrow batches.

* Aggregations: the states are computed from scratch and written, with every segment's token
  set to ``E``, in one transaction: the live processor continues exactly where the replay
  stopped (no gap, no double count).
* Transactional projections (``ctx.execute`` handlers): as a reset, ``on_reset`` handlers run
  first and every token is set back to the start with its replay ends (what each segment, or
  part of it, had handled is a replay, skipped by ``disallow_replay`` handlers; the rest is
  handled as new); each Spark partition then handles one segment in position order, committing
  its writes and the segment's token together every ``chunk`` events; at the end every token
  is set to ``E``.

Before anything is written: a preflight job ships the app's modules and checks on an executor
that they import and that the store opens there (read-only); after the fold, the rows Spark
read must equal the store's count of events up to ``E`` (and, for projections, the events
handled too), or the replay fails without writing states or moving tokens to ``E``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInputError, SparkJobError
from ..processing.aggregation import Aggregation
from ..processing.claims import Heartbeat, claim_all, node_name, release_all
from ..processing.context import Context
from ..processing.dispatch import Dispatch
from ..tokens import Token
from ..tracing import spans
from ..upcasting import Upcasters
from ..upcasting.arrow import upcast_batch
from .export import PREFIX, check_store, load_manifest
from .fold import KEYED_SCHEMA, STATE_SCHEMA, FoldSpec, add_keys, fold_sorted, fold_stage, spec_of
from .session import get_session, partitions_of
from .ship import executor_url, first_line, preflight
from .source import Keyed

log = logging.getLogger("eventlanes.spark")


@dataclass(frozen=True)
class ReplayResult:
    name: str
    end: int  # the position every segment's token was set to
    events: int  # events Spark read and folded (checked equal to the store's count up to end)
    keys: int  # aggregation states written (0 for projections)
    seconds: float


@dataclass
class _Input:
    """The events up to ``end`` and how to learn how many rows Spark read of them."""

    df: Any
    end: int
    expected: int  # events in (0, end] in the store (or the export)
    read: Callable[[], int | None]  # rows Spark read, once the plan has run
    columns: dict[str, str] | None = None  # an export's typed data columns (property -> type)
    chained_types: list[str] | None = None  # an export's event types with chained events
    parquet: bool = False
    pending: Future[None] | None = None  # the store's check of an export, run meanwhile
    #: the store's read: the event types with chained events it read (once the plan has run)
    chained: Callable[[], set[str] | None] | None = None
    #: the store's read of events alone, where ``df`` holds the executors' partial folds
    events_df: Any = None

    def verify(self) -> None:
        """Before anything is written: the store's check of the export passed (or raise)."""
        if self.pending is not None:
            self.pending.result()

    @property
    def events(self) -> Any:
        """The events' own columns (``FIELDS``), without an export's typed columns."""
        from .source import FIELDS

        keys = ["key"] if "key" in self.df.columns else []  # read on the executors (Keyed)
        return self.df.select(*FIELDS, *keys)


def _input(
    spark: Any,
    app: Any,
    url: str,
    n: int,
    parquet: str | None,
    decl: Any = None,
    upcasters: Upcasters | None = None,
    keyed: Keyed | None = None,
) -> _Input:
    """The events up to the store's head, or exactly the files of a Parquet export.
    ``decl``: a declarative aggregation's declaration (the store's read takes only what its
    plan reads, the declared properties typed); ``upcasters``: the processor's, applied on the
    executors as the events are read (an export holds what is stored); ``keyed``: a fold keyed
    by a data property reads the events it folds, their keys read on the executors."""
    from pyspark.sql import functions as F

    from ..processing.declarative import TYPES
    from .source import FIELDS, SCHEMA, Declared, read_events

    if parquet:  # the export's end: the live processor folds what came after it
        export = load_manifest(parquet, app.store)
        end, files, expected = export["end"], export["paths"], export["events"]
        if not files:  # an export of an empty store
            check_store(parquet, export, app.store)
            return _Input(spark.createDataFrame([], SCHEMA), end, 0, lambda: 0)
        # The store's count up to the export's end runs while Spark reads the files.
        pending: Future[None] = Future()
        threading.Thread(target=_settle, args=(pending, check_store, parquet, export, app.store),
                         daemon=True, name="eventlanes-export-check").start()  # fmt: skip
        columns = export["columns"]
        chained_types = export["chained_types"]
        schema = ", ".join([SCHEMA, *(f"`{PREFIX}{p}` {k}" for p, k in columns.items())])
        df = spark.read.schema(schema).parquet(*files).where(F.col("position") <= end)
        count = df.count  # of the files' rows, as read (an upcaster neither adds nor drops)
        if upcasters is not None:
            # The export's typed columns hold the stored shapes: the data is parsed instead.
            df = df.select(*FIELDS).mapInArrow(
                lambda it: (upcast_batch(upcasters, b) for b in it), SCHEMA
            )
            columns, chained_types = {}, sorted({upcasters.current(t) for t in chained_types})
        # Spark's own row count of those files (a declarative plan counts them in its job).
        return _Input(df, end, expected, count, columns, chained_types, True, pending)
    end = app.store.head()
    if decl is None:
        df, counter = read_events(spark, url, 0, end, n, keyed, upcasters)
        return _Input(df, end, app.store.count(until=end), counter.total)
    kinds, types = {p: TYPES[t] for p, t in decl.columns.items()}, tuple(sorted(decl.types))
    fields = tuple((op.kind, op.field, op.where) for op in decl.fields.values())
    # Folded on the executors as read; the events alone for the plan with source chains.
    df, counter = read_events(spark, url, 0, end, n, Declared(kinds, types, fields, decl.key),
                              upcasters)  # fmt: skip
    events, _ = read_events(spark, url, 0, end, n, Declared(kinds, types), upcasters)
    return _Input(df, end, app.store.count(until=end), counter.total,
                  chained=counter.chained_types, events_df=events)  # fmt: skip


def _keyed(agg: Aggregation) -> Keyed | None:
    """What the store's read gives a Python fold keyed by a data property (None: events)."""
    if agg.declaration is not None or agg.key_field is None or agg.folds.any:
        return None
    return Keyed(agg.key_field, tuple(sorted(agg.folds.by_type)))


def _settle(future: Future[None], fn: Callable[..., None], *args: Any) -> None:
    try:
        fn(*args)
    except BaseException as exc:  # noqa: BLE001 - handed to the replay's thread
        future.set_exception(exc)
    else:
        future.set_result(None)


def functions_of(proc: Any) -> list[Callable[..., Any]]:
    """The user's functions a replay of ``proc`` runs on executors (their modules ship)."""
    found: list[Any] = []
    if isinstance(proc, Aggregation):
        agg: Any
        for agg in (proc, *proc.stages):
            found += [agg.key, getattr(agg, "initial_state", None), getattr(agg, "initial", None)]
            found += [f for fs in agg.folds.by_type.values() for f in fs] + list(agg.folds.any)
    else:
        handlers = proc.handlers
        found += [h for _, h in handlers._entries] + [h for _, h in handlers.batch_handlers]
        found.append(getattr(proc.policy, "_key", None))
    if (upcasters := upcasters_of(proc)) is not None:
        found += upcasters.functions()
    return [f for f in found if f is not None]


def upcasters_of(proc: Any) -> Upcasters | None:
    """The upcasters into the types ``proc`` handles (shipped with the job; None: none)."""
    return proc.runtime.upcasters.into(proc.handled_types())


def hold_every_segment(app: Any, proc: Any, owner: str, wait: bool) -> tuple[list, Heartbeat]:
    """Every segment's claim, kept by the shared heartbeat (it survives database errors)."""
    app.initialize(proc.name)
    records = claim_all(app.tokens, proc.name, owner, wait, None)
    return records, Heartbeat(app.tokens, proc.name, owner, announce=False).start()


def check_read(name: str, what: str, read: int | None, expected: int) -> int:
    """Refuse to write anything unless Spark read exactly the store's events."""
    if read != expected:
        got = "an incomplete or inconsistent set of" if read is None else f"{read:,}"
        raise SparkJobError(
            f"{name}: Spark {what} {got} events but the store holds {expected:,} up to the "
            "replay's end: nothing was written (do executors see the same store?)"
        )
    return read


def replay(
    app: Any,
    name: str,
    spark: Any = None,
    master: str | None = None,
    parquet: str | None = None,
    partitions: int | None = None,
    wait: bool = False,
    conf: dict[str, str] | None = None,
    py_files: Iterable[str] = (),
    archives: Iterable[str] = (),
) -> ReplayResult:
    """Replay ``name`` from the start on ``spark`` (any session: built by the user, by
    ``spark-submit``, in a notebook) or on a new one for ``master``. With tracing on, the
    replay is one span (``replay NAME``, child of the caller's), never one per event."""
    tracer = spans.tracer()
    args = (app, name, spark, master, parquet, partitions, wait, conf, py_files, archives)
    if tracer is None:
        return _replay(*args)
    proc = app.get(name)
    base = spans.base_attributes(name, None, proc.guarantee.value, getattr(proc, "version", None))
    extra = {spans.ENGINE: "spark", "eventlanes.parquet": parquet or ""}
    with spans.batch(tracer, "replay", base, count=0, root=False, extra=extra) as span:
        result = _replay(*args)
        span.set_attributes({spans.MESSAGE_COUNT: result.events, spans.TOKEN: result.end,
                             "eventlanes.keys": result.keys})  # fmt: skip
        return result


def _replay(
    app: Any,
    name: str,
    spark: Any,
    master: str | None,
    parquet: str | None,
    partitions: int | None,
    wait: bool,
    conf: dict[str, str] | None,
    py_files: Iterable[str],
    archives: Iterable[str],
) -> ReplayResult:
    proc = app.get(name)
    if not isinstance(proc, Aggregation) and (
        proc.guarantee.value != "exactly-once" or proc.sources
    ):
        raise InvalidInputError(
            f"{proc.name!r}: Spark replays single-source exactly-once processors (this one is "
            f"{proc.guarantee.value}" + (", with several sources)" if proc.sources else ")")
        )
    # A store executors cannot see is refused before a JVM starts, where the master says so.
    url = executor_url(app.url, master) if spark is None and master else None
    spark = spark or get_session(master, conf=conf, py_files=py_files, archives=archives)
    url = url or executor_url(app.url, spark.sparkContext.master)
    n = partitions_of(spark, partitions)
    # Before any write: code and store reachable from an executor, or one clear error.
    preflight(spark, functions_of(proc), url, head=app.store.head(), reads_store=not parquet)
    owner = f"spark-replay:{node_name()}"
    records, beat = hold_every_segment(app, proc, owner, wait)
    start = time.perf_counter()
    try:
        decl = getattr(proc, "declaration", None)
        keyed = _keyed(proc) if isinstance(proc, Aggregation) else None
        source = _input(spark, app, url, n, parquet, decl, upcasters_of(proc), keyed)
        try:
            if isinstance(proc, Aggregation):
                events, keys = _aggregation(app, proc, source, n, owner, records)
            else:
                events, keys = _projection(app, proc, source, url, owner, records), 0
        except Exception as exc:
            source.verify()  # a stale export: say so, rather than what Spark made of it
            if type(exc).__module__.startswith(("pyspark", "py4j")):
                raise SparkJobError(f"{name}: the Spark job failed: {first_line(exc)}") from exc
            raise
    finally:
        beat.stop()
        release_all(app.tokens, proc.name, owner, records)
    return ReplayResult(name, source.end, events, keys, time.perf_counter() - start)


def fold_aggregation(
    spec: FoldSpec,
    df: Any,
    partitions: int,
    load: Any = None,
    columns: dict[str, str] | None = None,
    typed: Any = None,
) -> Any:
    """The Spark plan: key, route by crc32(key), sort by (key, position), fold per partition.
    ``columns``: an export's typed data columns (``typed``: the DataFrame holding them)."""
    from pyspark.sql import functions as F

    if spec.key_field is not None and not spec.any:
        # All in the JVM: filter the folded types and extract the key from the JSON data (or
        # an export's column of it: the same text for strings and integers).
        kind = (columns or {}).get(spec.key_field)
        if typed is not None and kind in ("string", "long"):
            key = F.col(PREFIX + spec.key_field).cast("string")
            df = typed.select(*df.columns, key.alias("key"))
        else:
            key = F.get_json_object("data", f"$.{spec.key_field}")
            if "key" in df.columns:  # read on the executors where exact (source.Keyed)
                key = F.coalesce(F.col("key"), key)
            df = df.withColumn("key", key)
        keyed = df.where(F.col("type").isin(list(spec.by_type))).where(F.col("key").isNotNull())
    else:
        keyed = df.mapInArrow(lambda it: add_keys(spec, it), KEYED_SCHEMA)
    seg = F.crc32(F.col("key").cast("binary")).bitwiseAND(partitions - 1)
    routed = keyed.withColumn("pk", _partition_of(df.sparkSession, partitions, seg))
    ordered = routed.repartition(partitions, "pk").sortWithinPartitions("key", "position")
    return ordered.drop("pk").mapInArrow(lambda it: fold_sorted(spec, it, load), STATE_SCHEMA)


_PARTITION_KEYS: dict[int, list[int]] = {}


def _partition_of(spark: Any, partitions: int, seg: Any) -> Any:
    """A column that Spark's hash partitioner sends to partition ``seg``: partition i holds
    exactly segment i (crc32 routing, as the local engine). Hash-partitioning the segment number
    itself would re-hash it (Murmur3) and could put two segments in one partition; range
    partitioning would run the whole input once more to sample it."""
    from pyspark.sql import functions as F

    if partitions not in _PARTITION_KEYS:
        found: dict[int, int] = {}
        rows = (
            spark.range(0, 64 * partitions)
            .select("id", F.pmod(F.hash("id"), F.lit(partitions)).alias("p"))
            .collect()
        )
        for row in rows:
            found.setdefault(row["p"], row["id"])
        _PARTITION_KEYS[partitions] = [found[i] for i in range(partitions)]
    keys = F.array(*[F.lit(k).cast("long") for k in _PARTITION_KEYS[partitions]])
    return F.element_at(keys, (seg + 1).cast("int"))


def fold_stages(spec: FoldSpec, folded: Any, partitions: int, loader_for: Any = None) -> list[Any]:
    """Plans folding each downstream stage's outputs, routed by the downstream key.
    ``loader_for(stage name)``: loads a stage's stored states (continuous mode)."""
    from pyspark.sql import functions as F

    plans = []
    for stage in spec.stages:
        load = loader_for(stage.name) if loader_for else None
        outs = folded.where((F.col("kind") == "out") & (F.col("name") == stage.name))
        routed = outs.repartition(partitions, "key").sortWithinPartitions("key", "position")
        plans.append(
            routed.mapInArrow(lambda it, s=stage, ld=load: fold_stage(s, it, ld), STATE_SCHEMA)
        )
    return plans


Encoded = dict[str, dict[str, tuple[str, str, int]]]  # name -> key -> (value, offsets, dropped)


def collect_states(df: Any) -> Encoded:
    """Rows of kind "state", still JSON-encoded as the executors wrote them, to save on the
    driver without decoding and encoding every state again."""
    table = df.where(df.kind == "state").toArrow()
    states: Encoded = {}
    cols = [table.column(c).to_pylist() for c in ("name", "key", "value", "offsets", "dropped")]
    for name, key, value, offsets, dropped in zip(*cols, strict=True):
        states.setdefault(name, {})[key] = (value, offsets, dropped)
    return states


def save_states(app: Any, conn: Any, name: str, states: Encoded) -> None:
    rows = [(key, *encoded) for key, encoded in states.get(name, {}).items()]
    app.aggregate_states.save_encoded(conn, name, rows)


def _aggregation(
    app: Any, agg: Aggregation, source: _Input, n: int, owner: str, records: list
) -> tuple[int, int]:
    spec = spec_of(agg, app.store.events_table)
    if agg.declaration is not None:  # native column expressions, no Python per event
        from .declarative import declared_states

        folded: Any = None
        decl, table = agg.declaration, app.store.events_table
        chained_types = source.chained_types
        if chained_types is None and source.chained is not None:
            # From the store: one pass, folded as if no event had a source chain, the read
            # telling which types have chained events. Only when a folded type has, the plan
            # with the chains' window runs (reading again); the first result is dropped.
            chained_types = []
        declared, read = declared_states(decl, source.df, table, source.columns, chained_types)
        if source.chained is not None:
            seen = source.chained()
            if seen is None or decl.types & seen:
                again = None if seen is None else sorted(seen)
                df = source.df if source.events_df is None else source.events_df
                declared, read = declared_states(decl, df, table, source.columns, again)
        states = {agg.name: declared}
        # From an export, the plan's own count is Spark's count of the files' rows (no second
        # job); from the store, the ranges' counts must agree with it too.
        if not source.parquet:
            check_read(agg.name, "read", source.read(), source.expected)
        events = check_read(agg.name, "read", read, source.expected)
    else:
        folded = fold_aggregation(spec, source.events, n, columns=source.columns, typed=source.df)
        if spec.stages:
            folded = folded.cache()
        states = collect_states(folded)
        events = check_read(agg.name, "read", source.read(), source.expected)
    for plan in fold_stages(spec, folded, n):
        for name, entries in collect_states(plan).items():
            states.setdefault(name, {}).update(entries)
    names = [agg.name, *(s.name for s in agg.stages)]
    source.verify()
    table = app.aggregate_states
    db = app.db
    with db.transaction() as conn:
        for name in names:  # from scratch: what the replay did not produce does not exist
            conn.execute(db.sql(f"DELETE FROM {table.table} WHERE aggregation = ?"), (name,))
        for name in names:
            save_states(app, conn, name, states)
        for record in records:
            app.tokens.store(agg.name, record.segment.id, Token(source.end), owner, conn=conn)
    if spec.stages:
        folded.unpersist()
    return events, sum(len(v) for v in states.values())


@dataclass
class _ProjectionSpec:
    name: str
    url: str
    owner: str
    dispatch: Dispatch
    policy: Any
    segments: list[tuple[int, int]]
    claim_timeout: float
    chunk: int


def _route(spec: _ProjectionSpec, batches: Any) -> Any:
    import pyarrow as pa

    from ..events import Event

    by_mask: dict[int, set[int]] = {}
    for seg_id, mask in spec.segments:
        by_mask.setdefault(mask, set()).add(seg_id)
    for batch in batches:
        cols = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
        seg_col = []
        for row in zip(*cols, strict=True):
            h = spec.policy.routing_hash(Event(*row))
            seg_col.append(next(h & m for m, ids in by_mask.items() if h & m in ids))
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, pa.array(seg_col, pa.int64())], names=[*batch.schema.names, "seg"]
        )


def _handle(spec: _ProjectionSpec, batches: Any) -> Any:
    """One segment per partition, in position order: handlers and the segment's token commit
    together every ``chunk`` events (fenced by the replay's claim)."""
    import pyarrow as pa

    from ..db import open_database
    from ..events import Event
    from ..segments import Segment
    from ..tokens import SQLTokenStore
    from .ship import open_readonly

    open_readonly(spec.url).close()  # never create a database the driver does not use
    db = open_database(spec.url)
    tokens = SQLTokenStore(db, spec.claim_timeout)
    masks = dict(spec.segments)
    counts: dict[int, int] = {}
    pending: list[Event] = []
    current: int | None = None

    def commit(seg_id: int) -> None:
        # A retried (or re-run) task starts its partition again: what an earlier attempt
        # committed is behind the segment's stored token, and is not handled twice.
        # The stored token is the reset's (see _run_projection): it says which events were
        # handled before (replays, skipped by disallow_replay handlers) and which are new.
        stored = tokens.token(spec.name, seg_id) or Token(0)
        todo = [e for e in pending if e.position > stored.position]
        if todo:
            with db.transaction() as conn:
                ctx = Context(spec.name, Segment(seg_id, masks[seg_id]), stored, conn,
                              db.backend, db.param, db.prefix)  # fmt: skip
                spec.dispatch.run(todo, ctx, stored)  # per-event and on_batch handlers
                done = stored.advance(todo[-1].position)
                tokens.store(spec.name, seg_id, done, spec.owner, conn=conn)
        counts[seg_id] = counts.get(seg_id, 0) + len(pending)
        pending.clear()

    try:
        for batch in batches:
            cols = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
            for row in zip(*cols, strict=True):
                seg_id = row[8]
                if seg_id != current and pending:
                    commit(current)  # type: ignore[arg-type]
                current = seg_id
                pending.append(Event(*row[:8]))
                if len(pending) >= spec.chunk:
                    commit(seg_id)
        if pending and current is not None:
            commit(current)
    finally:
        db.close()
    if counts:
        yield pa.RecordBatch.from_arrays(
            [pa.array(list(counts)), pa.array(list(counts.values()))], names=["seg", "events"]
        )


def _projection(app: Any, proc: Any, source: _Input, url: str, owner: str, records: list) -> int:
    dispatch = Dispatch(proc.name, proc.handlers, proc.policy)
    from pyspark import StorageLevel
    from pyspark.sql.types import LongType, StructField, StructType

    df = source.events
    segments = [(r.segment.id, r.segment.mask) for r in records]
    spec = _ProjectionSpec(proc.name, url, owner, dispatch, proc.policy, segments,
                           app.tokens.claim_timeout, 5000)  # fmt: skip
    schema = StructType([*df.schema.fields, StructField("seg", LongType())])
    routed = df.mapInArrow(lambda it: _route(spec, it), schema)
    routed = routed.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        # Read (and count) everything before any handler runs: a short read writes nothing.
        routed.count()
        check_read(proc.name, "read", source.read(), source.expected)
        source.verify()
        return _run_projection(app, proc, dispatch, spec, routed, source, owner, records)
    finally:
        routed.unpersist()


def _run_projection(
    app: Any,
    proc: Any,
    dispatch: Dispatch,
    spec: _ProjectionSpec,
    routed: Any,
    source: _Input,
    owner: str,
    records: list,
) -> int:
    db = app.db
    with db.transaction() as conn:  # a reset: reset handlers, tokens back to the start
        ctx = Context(proc.name, None, None, conn, db.backend, db.param, db.prefix)
        dispatch.reset(ctx)
        for record in records:
            # What each segment (each part of it) had handled is a replay; the rest is new,
            # also for the live processor if the replay stops half-way.
            token = Token.reset(record.token, 0, segment=record.segment)
            app.tokens.store(proc.name, record.segment.id, token, owner, conn=conn)
        app.dead_letters.clear(conn, proc.name)  # the replay delivers parked events again
    n = len(spec.segments)
    ordered = routed.repartition(n, "seg").sortWithinPartitions("seg", "position")
    counts = ordered.mapInArrow(lambda it: _handle(spec, it), "seg long, events long").collect()
    # Each segment's token is at the last event its handlers committed; all move to the end
    # only if every event of the store was handled.
    handled = check_read(proc.name, "handled", sum(r["events"] for r in counts), source.expected)
    with db.transaction() as conn:
        for record in records:
            done = (app.tokens.token(proc.name, record.segment.id) or Token(0)).advance(source.end)
            app.tokens.store(proc.name, record.segment.id, done, owner, conn=conn)
    return handled
