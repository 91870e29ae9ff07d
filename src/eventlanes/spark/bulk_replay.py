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
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import FieldTypeError, InvalidInputError, SparkJobError
from ..lakehouse import DeltaStates
from ..processing.aggregating.aggregation import Aggregation
from ..processing.aggregating.publish import publish_stored
from ..processing.tables.staging import StagedStates
from ..tokens import Token
from ..tokens.claims import Heartbeat, claim_all, node_name, release_all
from ..tracing import spans
from .declarative import FIELD_ERROR, string_key
from .export import PREFIX
from .fold import (
    KEYED_SCHEMA,
    STATE_SCHEMA,
    FoldSpec,
    add_keys,
    fold_sorted,
    fold_stage,
    spec_of,
)
from .input import ReplayInput, check_read, keyed_of, read_input, refuse_sources, upcasters_of
from .projections import replay_projection
from .session import get_session, master_of, partitions_of
from .ship import executor_url, first_line, preflight
from .staging import Staging
from .windows import refuse_windowed_delta, refuse_windows, replay_windows

log = logging.getLogger("eventlanes.spark")


@dataclass(frozen=True)
class ReplayResult:
    name: str
    end: int  # the position every segment's token was set to
    events: int  # events Spark read and folded (checked equal to the store's count up to end)
    keys: int  # aggregation states written (0 for projections)
    seconds: float


def functions_of(proc: Any) -> list[Callable[..., Any]]:
    """The user's functions a replay of ``proc`` runs on executors (their modules ship)."""
    found: list[Any] = []
    if isinstance(proc, Aggregation):
        agg: Any
        for agg in (proc, *proc.stages):
            found += [
                agg.key,
                getattr(agg, "initial_state", None),
                getattr(agg, "initial", None),
                getattr(agg, "merger", None),
            ]
            found += [f for fs in agg.folds.by_type.values() for f in fs] + list(agg.folds.any)
    else:
        found += proc.handlers.handlers()
        found.append(proc.policy.key_function)
    if (upcasters := upcasters_of(proc)) is not None:
        found += upcasters.functions()
    return [f for f in found if f is not None]


def hold_every_segment(app: Any, proc: Any, owner: str, wait: bool) -> tuple[list, Heartbeat]:
    """Every segment's claim, kept by the shared heartbeat (it survives database errors)."""
    app.initialize(proc.name)
    records = claim_all(app.tokens, proc.name, owner, wait, None)
    return records, Heartbeat(app.tokens, proc.name, owner, announce=False).start()


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
    remote: str | None = None,
    delta: str | None = None,
    delta_options: Mapping[str, str] | None = None,
) -> ReplayResult:
    """Replay ``name`` from the start on ``spark`` (any session: built by the user, by
    ``spark-submit``, in a notebook; a Spark Connect one too) or on a new one for ``master``
    (or for the Spark Connect server ``remote``, ``sc://host:port``). ``delta``: an
    aggregation's states are also written to the Delta table there (``delta_options``: its
    storage options), before the store's, with the position in the commit
    (:mod:`eventlanes.lakehouse.delta`). With tracing on, the replay is one span (``replay
    NAME``, child of the caller's), never one per event."""
    tracer = spans.tracer()
    refuse_windows(app.get(name))
    refuse_sources(app.get(name))
    target = _delta_target(app.get(name), delta, delta_options)
    args = (app, name, spark, master, parquet, partitions, wait, conf, py_files, archives,
            remote, target)  # fmt: skip
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
    remote: str | None,
    target: DeltaStates | None,
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
    spark = spark or get_session(master, conf=conf, py_files=py_files, archives=archives,
                                 remote=remote)  # fmt: skip
    url = url or executor_url(app.url, master_of(spark))
    n = partitions_of(spark, partitions)
    # Before any write: code and store reachable from an executor, or one clear error.
    preflight(spark, functions_of(proc), url, head=app.store.head(), reads_store=not parquet)
    owner = f"spark-replay:{node_name()}"
    records, beat = hold_every_segment(app, proc, owner, wait)
    start = time.perf_counter()
    try:
        if target is not None:  # another store's table: refused before the job
            target.check([r.segment.id for r in records], app.store.head())
        windowed = isinstance(proc, Aggregation) and proc.windowing is not None
        decl = None if windowed else getattr(proc, "declaration", None)
        keyed = keyed_of(proc) if isinstance(proc, Aggregation) and not windowed else None
        source = read_input(spark, app, url, n, parquet, decl, upcasters_of(proc), keyed)
        try:
            if windowed:
                events, keys = replay_windows(app, proc, source, n, owner, records)
            elif isinstance(proc, Aggregation):
                events, keys = _aggregation(app, proc, source, n, owner, records, url, target)
            else:
                events, keys = replay_projection(app, proc, source, url, owner, records), 0
        except Exception as exc:
            source.verify()  # a stale export: say so, rather than what Spark made of it
            refused = _refused(exc)
            if refused is not None:  # an event the local engine refuses too: as it says it
                raise refused from exc
            if type(exc).__module__.startswith(("pyspark", "py4j")):
                raise SparkJobError(f"{name}: the Spark job failed: {first_line(exc)}") from exc
            raise
    finally:
        beat.stop()
        release_all(app.tokens, proc.name, owner, records)
    return ReplayResult(name, source.end, events, keys, time.perf_counter() - start)


def _delta_target(proc: Any, uri: str | None, options: Mapping[str, str] | None) -> Any:
    """The Delta table a replay writes (None: none), checked before a session starts."""
    if uri is None:
        if options:
            raise InvalidInputError(f"{proc.name}: Delta storage options without a Delta table")
        return None
    if not isinstance(proc, Aggregation):
        raise InvalidInputError(
            f"{proc.name!r}: a Delta table holds an aggregation's states; this is a projection "
            "(its handlers write its own tables)"
        )
    refuse_windowed_delta(proc)  # its windows are rows of their own, not keyed states
    return DeltaStates(uri, proc.name, proc.declaration, options)


#: how ``policies.state_key`` ends its refusal of a key that is not a string
KEY_REFUSED = "render it as text on purpose, e.g. str(...))"


def _refused(exc: BaseException) -> InvalidInputError | None:
    """The input error a Spark failure carries (a key or field the local engine refuses too,
    raised by Spark or by the key function's check on an executor), or None."""
    if not type(exc).__module__.startswith(("pyspark", "py4j")):
        return None
    text = str(exc)
    if FIELD_ERROR in text:
        line = text[text.index(FIELD_ERROR) + len(FIELD_ERROR) :].splitlines()[0]
        return FieldTypeError(line.split(" SQLSTATE")[0].rstrip(". "))
    marker = "InvalidInputError: "
    if marker in text:  # a key the fold refused (policies.state_key): an input error here too
        line = text[text.rindex(marker) + len(marker) :].splitlines()[0]
        if line.endswith(KEY_REFUSED) or "key is None" in line:
            return InvalidInputError(line)
    return None


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
        # an export's column of strings). A key that is not a string fails the job naming the
        # event, as the local engine refuses it; so does a missing or null one.
        kind = (columns or {}).get(spec.key_field)
        folded = F.col("type").isin(list(spec.by_type))
        if typed is not None and kind == "string":
            key = F.col(PREFIX + spec.key_field)
            df = typed.select(*df.columns, key.alias("key"))
        else:
            key = string_key(F.col("data"), spec.key_field, f"aggregation {spec.name!r}")
            if "key" in df.columns:  # read on the executors where exact (source.Keyed)
                key = F.coalesce(F.col("key"), key)
            df = df.withColumn("key", F.when(folded, key))
        missing = F.concat(
            F.lit(f"{FIELD_ERROR}event "), F.col("position").cast("string"), F.lit(" ("),
            F.col("type"), F.lit(f"): no key property {spec.key_field!r} for aggregation "
                                 f"{spec.name!r} (or its value is null)"),
        )  # fmt: skip
        keyed = df.where(folded).withColumn(
            "key", F.coalesce(F.col("key"), F.raise_error(missing).cast("string"))
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


#: name -> key -> (value, offsets, dropped, dropped_by), as stored (JSON texts; dropped_by None
#: while none was dropped)
Encoded = dict[str, dict[str, tuple[str, str, int, str | None]]]


def collect_states(df: Any) -> Encoded:
    """Rows of kind "state", still JSON-encoded as the executors wrote them, to save on the
    driver without decoding and encoding every state again."""
    table = df.where(df.kind == "state").toArrow()
    states: Encoded = {}
    names = ("name", "key", "value", "offsets", "dropped", "dropped_by")
    cols = [table.column(c).to_pylist() for c in names]
    for name, key, value, offsets, dropped, by in zip(*cols, strict=True):
        states.setdefault(name, {})[key] = (value, offsets, dropped, by)
    return states


def save_states(app: Any, conn: Any, name: str, states: Encoded) -> None:
    rows = [(key, *encoded) for key, encoded in states.get(name, {}).items()]
    app.aggregate_states.save_encoded(conn, name, rows)


def _aggregation(
    app: Any,
    agg: Aggregation,
    source: ReplayInput,
    n: int,
    owner: str,
    records: list,
    url: str | None,
    target: DeltaStates | None = None,
) -> tuple[int, int]:
    """States folded by Spark and staged where the driver's memory does not grow with the
    keys (:class:`Staging`), written to the Delta table ``target`` if any (read back from the
    stage a bounded chunk at a time), then moved in with every segment's token in one
    transaction."""
    spec = spec_of(agg, app.store.events_table)
    names = [agg.name, *(s.name for s in agg.stages)]
    with StagedStates(app.aggregate_states, agg.name) as stage:
        staging = Staging(stage, agg.name, source.expected, url if not source.parquet else None)
        folded: Any = None
        if agg.declaration is not None:  # native column expressions, no Python per event
            events = _declared(app, agg, source, staging)
        else:
            folded = fold_aggregation(spec, source.events, n, columns=source.columns,
                                      typed=source.df)  # fmt: skip
            if spec.stages:
                folded = folded.cache()
            staging.states(folded)
            events = check_read(agg.name, "read", source.read(), source.expected)
        for plan in fold_stages(spec, folded, n):
            staging.states(plan)
        source.verify()
        staging.check()

        def tokens(conn: Any) -> None:
            for record in records:
                app.tokens.store(agg.name, record.segment.id, Token(source.end), owner, conn=conn)

        publishers: list[Any] = [agg, *agg.stages]
        for published in publishers:  # downstream first: before the commit
            if published.publish is not None:
                for part in stage.states_of(published.name):
                    publish_stored(published.publish, published.name, part, published is not agg)
        if target is not None:
            segments = [record.segment.id for record in records]
            target.write(stage.rows(), segments, source.end, staging.staged)
        stage.replace(names, tokens)
        if spec.stages:
            folded.unpersist()
        return events, staging.staged


def _declared(app: Any, agg: Aggregation, source: ReplayInput, staging: Staging) -> int:
    """Stage a declarative aggregation's states; the events Spark read (checked)."""
    from .declarative import declared_plan

    decl, table = agg.declaration, app.store.events_table
    assert decl is not None
    chained_types = source.chained_types
    if chained_types is None and source.chained is not None:
        # From the store: one pass, folded as if no event had a source chain, the read
        # telling which types have chained events. Only when a folded type has, the plan
        # with the chains' window runs (reading again); the first result is dropped.
        chained_types = []
    read = staging.declared(declared_plan(decl, source.df, table, source.columns, chained_types))
    if source.chained is not None:
        seen = source.chained()
        if seen is None or decl.types & seen:
            staging.clear()
            again = None if seen is None else sorted(seen)
            df = source.df if source.events_df is None else source.events_df
            read = staging.declared(declared_plan(decl, df, table, source.columns, again))
    # From an export, the plan's own count is Spark's count of the files' rows (no second
    # job); from the store, the ranges' counts must agree with it too.
    if not source.parquet:
        check_read(agg.name, "read", source.read(), source.expected)
    return check_read(agg.name, "read", read, source.expected)
