"""Bulk replay on Spark: ``el.spark.replay(app, name, spark=session)``.

The processor (or aggregation) must be stopped everywhere: the replay holds every segment's
claim for its whole run (extended by a heartbeat), reads the store up to its head ``E`` in
parallel, routes with the local engine's stable hash (``F.crc32`` of the key), keeps per-key
order (sorted by position within each key) and folds with the user's own code on Arrow batches.

* Aggregations: the states are computed from scratch and written, with every segment's token
  set to ``E``, in one transaction: the live processor continues exactly where the replay
  stopped (no gap, no double count).
* Transactional projections (``ctx.execute`` handlers): ``on_reset`` handlers run first; each
  Spark partition then handles one segment in position order, committing its writes and the
  segment's token together every ``chunk`` events; at the end every token is set to ``E``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInputError
from ..processing.aggregation import Aggregation
from ..processing.claims import Heartbeat, claim_all, node_name, release_all
from ..processing.context import Context
from ..processing.dispatch import Dispatch
from ..tokens import Token
from .export import read_manifest
from .fold import KEYED_SCHEMA, STATE_SCHEMA, FoldSpec, add_keys, fold_sorted, fold_stage, spec_of
from .session import get_session


@dataclass(frozen=True)
class ReplayResult:
    name: str
    end: int  # the position every segment's token was set to
    events: int  # events read
    keys: int  # aggregation states written (0 for projections)
    seconds: float


def _events(spark: Any, app: Any, end: int, partitions: int, files: list[str] | None) -> Any:
    """The events up to ``end``: from the store, or exactly the files of a Parquet export."""
    from pyspark.sql import functions as F

    from .source import SCHEMA

    if files is not None:
        if not files:  # an export of an empty store
            return spark.createDataFrame([], SCHEMA)
        return spark.read.schema(SCHEMA).parquet(*files).where(F.col("position") <= end)
    return (
        spark.read.format("eventlanes")
        .option("url", app.url)
        .option("until", str(end))
        .option("partitions", str(partitions))
        .load()
    )


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def replay(
    app: Any,
    name: str,
    spark: Any = None,
    master: str | None = None,
    parquet: str | None = None,
    partitions: int | None = None,
    wait: bool = False,
) -> ReplayResult:
    import time

    proc = app.get(name)
    spark = spark or get_session(master)
    n = _pow2(partitions or spark.sparkContext.defaultParallelism)
    owner = f"spark-replay:{node_name()}"
    app.initialize(name)
    records = claim_all(app.tokens, proc.name, owner, wait, None)
    beat = Heartbeat(app.tokens, proc.name, owner, announce=False).start()
    start = time.perf_counter()
    try:
        if parquet:  # the export's end: the live processor folds what came after it
            export = read_manifest(parquet, app.store)
            end, files = export["end"], export["paths"]
        else:
            end, files = app.store.head(), None
        df = _events(spark, app, end, n, files)
        if isinstance(proc, Aggregation):
            events, keys = _aggregation(app, proc, df, n, end, owner, records)
        else:
            events, keys = _projection(app, proc, df, end, owner, records), 0
    finally:
        beat.stop()
        release_all(app.tokens, proc.name, owner, records)
    return ReplayResult(name, end, events, keys, time.perf_counter() - start)


def fold_aggregation(spec: FoldSpec, df: Any, partitions: int, load: Any = None) -> Any:
    """The Spark plan: key, route by crc32(key), sort by (key, position), fold per partition."""
    from pyspark.sql import functions as F

    if spec.key_field is not None and not spec.any:
        # All in the JVM: filter the folded types and extract the key from the JSON data.
        keyed = (
            df.where(F.col("type").isin(list(spec.by_type)))
            .withColumn("key", F.get_json_object("data", f"$.{spec.key_field}"))
            .where(F.col("key").isNotNull())
        )
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
    app: Any, agg: Aggregation, df: Any, n: int, end: int, owner: str, records: list
) -> tuple[int, int]:
    spec = spec_of(agg, app.store.events_table)
    if agg.declaration is not None:  # native column expressions, no Python per event
        from .declarative import declared_states

        folded: Any = None
        states = {agg.name: declared_states(agg.declaration, df, app.store.events_table)}
    else:
        folded = fold_aggregation(spec, df, n)
        if spec.stages:
            folded = folded.cache()
        states = collect_states(folded)
    for plan in fold_stages(spec, folded, n):
        for name, entries in collect_states(plan).items():
            states.setdefault(name, {}).update(entries)
    names = [agg.name, *(s.name for s in agg.stages)]
    table = app.aggregate_states
    db = app.db
    with db.transaction() as conn:
        for name in names:  # from scratch: what the replay did not produce does not exist
            conn.execute(db.sql(f"DELETE FROM {table.table} WHERE aggregation = ?"), (name,))
        for name in names:
            save_states(app, conn, name, states)
        for record in records:
            app.tokens.store(agg.name, record.segment.id, Token(end), owner, conn=conn)
    if spec.stages:
        folded.unpersist()
    return app.store.count(until=end), sum(len(v) for v in states.values())


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

    db = open_database(spec.url)
    tokens = SQLTokenStore(db, spec.claim_timeout)
    masks = dict(spec.segments)
    counts: dict[int, int] = {}
    pending: list[Event] = []
    current: int | None = None

    def commit(seg_id: int) -> None:
        with db.transaction() as conn:
            ctx = Context(spec.name, Segment(seg_id, masks[seg_id]), None, conn, db.backend,
                          db.param, db.prefix)  # fmt: skip
            spec.dispatch.run(pending, ctx, True)  # per-event and on_batch handlers, as live
            tokens.store(spec.name, seg_id, Token(pending[-1].position), spec.owner, conn=conn)
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


def _projection(app: Any, proc: Any, df: Any, end: int, owner: str, records: list) -> int:
    if proc.guarantee.value != "exactly-once" or proc.sources:
        raise InvalidInputError(
            f"{proc.name!r}: Spark replays single-source exactly-once processors (this one is "
            f"{proc.guarantee.value}" + (", with several sources)" if proc.sources else ")")
        )
    dispatch = Dispatch(proc.name, proc.handlers, proc.policy)
    db = app.db
    with db.transaction() as conn:  # like a reset: reset handlers, tokens back to the start
        ctx = Context(proc.name, None, None, conn, db.backend, db.param, db.prefix)
        dispatch.reset(ctx)
        for record in records:
            app.tokens.store(proc.name, record.segment.id, Token(0), owner, conn=conn)
    segments = [(r.segment.id, r.segment.mask) for r in records]
    spec = _ProjectionSpec(proc.name, app.url, owner, dispatch, proc.policy, segments,
                           app.tokens.claim_timeout, 5000)  # fmt: skip
    from pyspark.sql.types import LongType, StructField, StructType

    n = len(segments)
    schema = StructType([*df.schema.fields, StructField("seg", LongType())])
    routed = df.mapInArrow(lambda it: _route(spec, it), schema)
    ordered = routed.repartition(n, "seg").sortWithinPartitions("seg", "position")
    counts = ordered.mapInArrow(lambda it: _handle(spec, it), "seg long, events long").collect()
    with db.transaction() as conn:
        for record in records:
            app.tokens.store(proc.name, record.segment.id, Token(end), owner, conn=conn)
    return sum(r["events"] for r in counts)
