"""Windowed aggregations on Spark: a bulk replay whose windows, closes, late inputs and counts
equal the local engine's on the same store (:mod:`eventlanes.windows.reference` says what
both must produce; the tests hold them to it and to each other).

The store's clock is a function of the log prefix, so Spark computes it over the kept read
without a single ordered pass: the largest (clamped) time of each bucket of positions (a few
numbers, on the driver), then each input's largest time before it (the buckets below, and a
running maximum within its own). A window closes at the first position whose time reaches its
end plus the lateness; the inputs grouped by the step of the last such threshold their time
reaches give the first position per step (one number per grid step some time falls in), and
the driver turns that into a suffix minimum the fold reads. Then each key's inputs, in
position order on a partition chosen by the key's hash, are deduped and folded by the local
engine's rules, and come back as rows: its windows, its late inputs, its entry and, per
partition, each segment's counts. The driver brings them over a bounded part at a time and
writes them with every segment's clock row and token in one transaction; on SQLite the parts
are staged first (temporary tables of its connection, no lock on the store), and the
transaction only moves them in.

A session's end is known only once its key is folded, and calendar windows are on no grid:
with the store's clock, where each of those the clock passed closed is found afterwards, by
Spark, from the positions where the clock grew (:func:`closes_by_end`). The closed windows
are published (``publish=``), folded into the downstream stages and given to ``on_close`` on
the driver as the parts come over; the stages' states and the events ``on_close`` returns
are written with the rest.

The window start formula as a Spark column (:func:`start_column`) is kept equal to Python's
and SQL's (:mod:`eventlanes.windows.kinds`) on integer microseconds; Spark's own ``window()``
works on TimestampType with the session's rules, and the engines must agree bit for bit.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import InvalidInputError, SparkJobError
from ..processing.aggregating.aggregation import Aggregation
from ..processing.aggregating.downstream import by_stage, fold_downstream
from ..processing.aggregating.publish import publish_states
from ..processing.tables.staging import StagedStates
from ..processing.tables.states import Entry, decode
from ..processing.tables.windows import Checkpoint, StagedWindows, Win
from ..processing.windowing.publish import (
    Closed,
    closed_windows,
    on_close,
    stage_outputs,
    window_records,
)
from ..processing.windowing.sessions import merge_of
from ..tokens import Token
from ..windows.kinds import Hopping, Tumbling
from ..windows.spec import Windowing
from .input import check_read
from .staging import parts_of
from .window_fold import (
    OUT_NAMES,
    OUT_SCHEMA,
    TIMED_SCHEMA,
    Closes,
    WindowFold,
    fold_windows,
    timed,
)

BUCKETS_PER_PARTITION = 4


def start_column(t: Any, step: Any, offset: Any = 0) -> Any:
    """The start of the ``step``-aligned window holding the long column ``t`` (``step`` and
    ``offset``: integers, or long columns)."""
    from pyspark.sql import functions as F

    def col(v: Any) -> Any:
        return F.lit(int(v)) if isinstance(v, int) else v

    return t - F.pmod(t - col(offset), col(step))


def refuse_windows(proc: Any) -> None:
    """What Spark does not run of a windowed aggregation yet, refused before any work: upcast
    inputs (a continuous run refuses segments at different positions when it folds)."""
    if not isinstance(proc, Aggregation) or proc.windowing is None:
        return
    merge_of(proc)  # sessions without a merge function: as the local engine refuses them
    if proc.upcasters.into(proc.handled_types()) is not None:
        raise InvalidInputError(
            f"aggregation {proc.name!r} is windowed: windows do not read upcast events yet "
            "(eventlanes run --engine local)"
        )


def refuse_windowed_delta(proc: Aggregation) -> None:
    """A Delta table for a windowed aggregation, refused before any work."""
    if proc.windowing is None:
        return
    raise InvalidInputError(
        f"aggregation {proc.name!r} is windowed: a Delta table holds keyed states, and its "
        "windows are written to the store only (agg.windows(), the window_states table)"
    )


def off_grid(spec: Windowing) -> bool:
    """Windows whose closes the store's clock gives only once their ends are known (sessions,
    calendar windows): :func:`closes_by_end` finds them."""
    return spec.clock == "store" and not isinstance(spec.window, Tumbling | Hopping)


def clock_columns(
    timed_df: Any,
    spec: Windowing,
    end: int,
    buckets: int,
    start: tuple[int, int | None] = (0, None),
    folds_after: int = 0,
) -> tuple[Any, Closes, int, list[int | None]]:
    """``timed_df`` (the rows after ``start[0]``, whose clock is ``start[1]``) with ``bucket``
    (of positions) and ``before`` (the store clock's time before each row's position), where
    the clock closes windows (off a grid: only the clock at the end), how many inputs past
    ``folds_after`` are folded, and the clock at each bucket's end: two small jobs (one off a
    grid), their answers on the driver. With each key's clock: ``before`` null, no closes,
    one job counting the inputs."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if spec.clock != "store":  # each key's clock: its own earlier inputs, read in the fold
        folded = F.col("key").isNotNull() & (F.col("position") > folds_after)
        inputs = timed_df.where(folded).count()
        return (
            timed_df.withColumn("before", F.lit(None).cast("long")),
            Closes([], [], None),
            inputs,
            [],
        )
    first, running = start
    bucket = ((F.col("position") - first - 1) * buckets / F.lit(max(end - first, 1))).cast("long")
    df = timed_df.withColumn("bucket", bucket)
    folded = F.when(F.col("position") > folds_after, F.col("key"))
    found = df.groupBy("bucket").agg(F.max("t"), F.count(folded)).collect()
    tops = {r[0]: r[1] for r in found}
    below: list[int | None] = []
    for b in range(buckets):  # the largest time in the buckets before each
        below.append(running)
        top = tops.get(b)
        if top is not None and (running is None or top > running):
            running = top
    base = F.element_at(F.array(*[F.lit(v).cast("long") for v in below]),
                        F.col("bucket").cast("int") + 1)  # fmt: skip
    within = F.max("t").over(
        Window.partitionBy("bucket").orderBy("position").rowsBetween(Window.unboundedPreceding, -1)
    )
    inputs = sum(r[2] for r in found)
    with_clock = df.withColumn("before", F.greatest(base, within))
    window: Any = spec.window
    if not isinstance(window, Tumbling | Hopping):  # no grid: found by closes_by_end
        return with_clock, Closes([], [], running), inputs, [*below[1:], running]
    # the grid step of the last window whose threshold (end + lateness) a time reaches
    x = F.col("t") - F.lit(window.offset + window.size + spec.lateness)
    step = ((x - F.pmod(x, F.lit(window.step))) / F.lit(window.step)).cast("long")
    firsts = sorted(
        (r[0], r[1]) for r in df.where(F.col("t").isNotNull())
        .groupBy(step.alias("k")).agg(F.min("position")).collect()
    )  # fmt: skip
    suffix: list[int] = []
    for _, first in reversed(firsts):
        suffix.append(first if not suffix else min(first, suffix[-1]))
    closes = Closes([k for k, _ in firsts], suffix[::-1], running)
    return with_clock, closes, inputs, [*below[1:], running]


def closes_by_end(
    with_clock: Any,
    folded: Any,
    lateness: int,
    latest: int | None,
    reached: list[int | None],
    kinds: tuple[str, ...] = ("window", "published"),
) -> Any:
    """``(kind, key, a, closed)`` of each window of ``folded`` off a grid (a session, a
    calendar window: rows of ``kinds``, its own and the one that publishes it) the store's
    clock passed: the
    first position whose time reaches its end plus the lateness. That position is where the
    clock grew (its time is above the clock before it), in the first bucket whose clock
    (``reached``, at each bucket's end) reaches the threshold: within a bucket, the thresholds
    and those positions sorted by time together, largest first, each threshold takes the
    smallest position seen so far."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    floor = -(2**63)  # a bucket before any time: below every threshold
    marks = F.array(*[F.lit(floor if v is None else v).cast("long") for v in reached])
    x = F.col("b") + F.lit(lateness)
    passed = folded.where(
        F.col("kind").isin(*kinds) & F.col("c").isNull() & (x <= F.lit(latest).cast("long"))
    )
    thresholds = passed.select(
        F.size(F.filter(marks, lambda m: m < x)).cast("long").alias("bucket"), x.alias("v"),
        F.lit(1).alias("side"), F.lit(None).cast("long").alias("position"), "kind", "key", "a",
    )  # fmt: skip
    grew = F.col("t").isNotNull() & (F.col("before").isNull() | (F.col("t") > F.col("before")))
    none = F.lit(None).cast("string")
    breaks = with_clock.where(grew).select(
        "bucket", F.col("t").alias("v"), F.lit(0).alias("side"), "position", none.alias("kind"),
        none.alias("key"), F.lit(None).cast("long").alias("a"),
    )  # fmt: skip
    order = Window.partitionBy("bucket").orderBy(F.desc("v"), "side")
    first = F.min("position").over(order.rowsBetween(Window.unboundedPreceding, 0))
    both = breaks.unionByName(thresholds).withColumn("closed", first)
    return both.where(F.col("side") == 1).select("kind", "key", "a", "closed")


def with_closes(folded: Any, closed: Any) -> Any:
    """``folded``'s rows with where :func:`closes_by_end` says each window it returned open
    closed (``closed``: its rows for ``folded``'s kinds only)."""
    from pyspark.sql import functions as F

    joined = folded.join(closed, ["kind", "key", "a"], "left")
    return joined.withColumn("c", F.coalesce("c", "closed")).select(*OUT_NAMES)


def replay_windows(
    app: Any, agg: Aggregation, source: Any, n: int, owner: str, records: list
) -> tuple[int, int]:
    """Fold a windowed aggregation from the start on Spark and write its windows, late inputs,
    entries, clock rows and every segment's token (set to the read's end) in one transaction;
    (events read, keys written)."""
    from pyspark import StorageLevel

    spec = agg.windowing
    assert spec is not None
    # as the local engine refuses it: a changed definition is a new version
    spec.refuse_other(agg.name, agg.version, app.runtime.windows.definitions(agg.name))
    fold = WindowFold.of(agg, app.store.events_table, [r.segment for r in records])
    # kept: the clock's jobs and the fold read it (each event's time and key computed once)
    timed_df = source.events.mapInArrow(lambda it: timed(fold, it), TIMED_SCHEMA).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    try:
        return _fold_and_write(app, agg, fold, timed_df, source, n, owner, records)
    finally:
        timed_df.unpersist()


def _fold_and_write(
    app: Any, agg: Aggregation, fold: WindowFold, timed_df: Any, source: Any, n: int,
    owner: str, records: list,
) -> tuple[int, int]:  # fmt: skip
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    spec = fold.spec
    buckets = n * BUCKETS_PER_PARTITION
    with_clock, closes, expected, reached = clock_columns(timed_df, spec, source.end, buckets)
    inputs = with_clock.drop("bucket").where(F.col("key").isNotNull())
    folded = (
        inputs.repartition(n, "key")
        .sortWithinPartitions("key", "position")
        .mapInArrow(lambda it: fold_windows(fold, closes, it), OUT_SCHEMA)
    )
    events = check_read(agg.name, "read", source.read(), source.expected)
    source.verify()  # an export: the store matches it (checked meanwhile), or nothing written
    # folded before the write's transaction opens (it holds SQLite's write lock): inside it,
    # only the kept rows are brought over, a bounded part at a time
    kept = folded.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        total = kept.count()
        rows = kept
        if off_grid(spec):
            closed = closes_by_end(with_clock, kept, spec.lateness, closes.latest, reached)
            rows = with_closes(kept, closed)
        keys = _write(app, agg, fold, rows, total, expected, source.end, closes, owner, records)
    finally:
        kept.unpersist()
    return events, keys


#: per part: windows, late inputs, states, counts, windows to publish, inputs dropped (as
#: duplicates) by this fold, stored windows to delete (key, start)
Part = tuple[
    list[Any], list[Any], list[Any], list[Any], list[tuple[str, int, Win]], int,
    list[tuple[str, int]],
]  # fmt: skip


def fold_rows(folded: Any, bound: int, name: str) -> Iterator[Part]:
    """The fold's rows brought over a bounded part at a time: per part its windows (key,
    start, end, value, closed_at, revision), late inputs (position, key, t, windows, amended,
    recorded_at), states (key, value, offsets, dropped, dropped_by), counts (segment,
    folded, late, clamped), the closed windows to publish (key, start, window whose
    ``closed_at`` is its root's position), how many inputs the fold dropped and the stored
    sessions to delete (key, start)."""
    for table in parts_of(folded, bound, f"replay of {name}"):
        cols = {c: table.column(c).to_pylist() for c in table.column_names}
        rows = list(zip(*(cols[c] for c in OUT_NAMES), strict=True))
        yield (
            [(k, a, b, t, c, d) for kind, k, a, b, c, d, t, _, _ in rows if kind == "window"],
            [(a, k, b, json.loads(t), bool(c), d) for kind, k, a, b, c, d, t, _, _ in rows
             if kind == "late"],
            [(k, t, more, a, by) for kind, k, a, _, _, _, t, more, by in rows
             if kind == "state"],
            [(seg, f, late, c) for kind, _, seg, f, late, c, _, _, _ in rows if kind == "count"],
            [(k, a, Win(b, decode(t), d, c)) for kind, k, a, b, c, d, t, _, _ in rows
             if kind == "published"],
            sum(b for kind, _, _, b, _, _, _, _, _ in rows if kind == "state"),
            [(k, a) for kind, k, a, *_ in rows if kind == "drop"],
        )  # fmt: skip


class Tally:
    """What the parts held: the counts per segment, states and their dropped inputs; the
    check that every input read is accounted for."""

    def __init__(self) -> None:
        self.counts: dict[int, list[int]] = {}
        self.keys = self.dropped = 0

    def add(self, states: list[Any], counts: list[Any], dropped: int | None = None) -> None:
        """``dropped``: the inputs dropped by this fold (else the states' totals: a replay's)."""
        self.keys += len(states)
        self.dropped += sum(s[3] for s in states) if dropped is None else dropped
        for seg, f, late, c in counts:
            n = self.counts.setdefault(seg, [0, 0, 0])
            n[0], n[1], n[2] = n[0] + f, n[1] + late, n[2] + c

    def check(self, name: str, inputs: int) -> None:
        accounted = sum(n[0] + n[1] for n in self.counts.values()) + self.dropped
        if accounted != inputs:  # a part lost or doubled: nothing written
            raise SparkJobError(
                f"{name}: Spark folded, kept late or dropped {accounted:,} inputs but read "
                f"{inputs:,}: nothing was written"
            )


def publish_closed(agg: Aggregation, closed: list[tuple[str, int, Win]]) -> Closed:
    """Publish closed windows (key, start, window whose ``closed_at`` is its root's position),
    acknowledged before anything commits, and return them with their roots; one with no
    position stops the replay."""
    for key, start, w in closed:
        if w.closed_at is None:  # a close lost: nothing published, nothing written
            raise SparkJobError(
                f"{agg.name}: the window of key {key!r} starting at {start} closed, but Spark "
                "gave no position where it did: nothing was written"
            )
    # a key's windows are all in one part: the index among those it published at a position
    # is the local engine's
    done = closed_windows(closed)
    if agg.publish is not None and done:
        agg.publish.publish(window_records(agg.name, done))
    return done


class Downstream:
    """What a replay's closed windows feed besides a sink, held on the driver until the
    commit: each downstream stage's states (folded by the local engine's rule, starting from
    none: a replay replaces them; or from what ``stored(stage, keys)`` reads: a continuous
    run's) and the ``on_close`` functions' events."""

    def __init__(
        self, agg: Aggregation, stored: Callable[[str, list[str]], dict[str, Entry]] | None = None
    ) -> None:
        self.agg, self.stored = agg, stored
        self.entries: dict[str, dict[str, Entry]] = {s.name: {} for s in agg.stages}
        self.newest: dict[str, dict[str, Any]] = {s.name: {} for s in agg.stages}
        self.runs: list[tuple[str, list[Any]]] = []

    def add(self, done: Closed) -> None:
        agg = self.agg
        if agg.stages and done:
            for stage, keyed in by_stage(stage_outputs(agg.name, agg.stages, done)):
                mine, entries = self.newest[stage.name], self.entries[stage.name]
                if self.stored is not None:
                    missing = sorted({k for k, *_ in keyed}.difference(entries))
                    entries.update(self.stored(stage.name, missing) if missing else {})
                for key, coords in fold_downstream(stage, keyed, entries).items():
                    held = mine.get(key)  # the newest by position: parts come by upstream key
                    if held is None or tuple(coords[2]) > tuple(held[2]):
                        mine[key] = coords
        if agg.closers and done:
            self.runs += on_close(agg.name, agg.closers, done)

    def publish(self) -> None:
        """The stages' states, to their sinks, acknowledged before anything commits."""
        for stage in self.agg.stages:
            newest = self.newest[stage.name]
            if stage.publish is not None and newest:
                publish_states(stage.publish, stage.name, self.entries[stage.name], newest,
                               None, newest)  # fmt: skip

    def write(self, conn: Any, states: Any, store: Any) -> None:
        """In the replay's transaction: the stages' states replace theirs, the events are
        appended."""
        for stage in self.agg.stages:
            if self.stored is None:
                states.delete_all(conn, stage.name)
            states.save(conn, stage.name, self.entries[stage.name])
        if self.runs:
            store.append_runs(self.runs, conn=conn)


def check_closed(name: str, passed: int | None, wins: list[Any]) -> None:
    """Windows off a grid with the store's clock: each one ending at or before ``passed``
    came back with the position where it closed, or nothing is written."""
    if passed is None:
        return
    for key, start, end, _, closed_at, _ in wins:
        if closed_at is None and end <= passed:
            raise SparkJobError(
                f"{name}: the window of key {key!r} starting at {start} ended before the "
                "clock at the replay's end, but Spark gave no position where it closed: "
                "nothing was written"
            )


def _write(
    app: Any,
    agg: Aggregation,
    fold: WindowFold,
    folded: Any,
    rows_bound: int,
    inputs: int,
    end: int,
    closes: Closes,
    owner: str,
    records: list,
) -> int:
    """Everything the replay folded, in one transaction; refused (nothing written) unless
    every input read is folded, late or a duplicate. On SQLite the rows are staged first
    (temporary tables of this connection: no lock on the store while the parts come over),
    and the transaction only moves them in; on PostgreSQL, whose writes lock rows only, the
    transaction writes the parts as they come."""
    rt, name = app.runtime, agg.name
    tally = Tally()
    definition = fold.spec.definition()

    passed = None  # off a grid: the clock every window ending before it must have closed at
    if off_grid(fold.spec):
        passed = None if closes.latest is None else closes.latest - fold.spec.lateness

    downstream = Downstream(agg)

    def finish(conn: Any) -> None:
        downstream.write(conn, rt.states, rt.store)
        for record in records:
            seg = record.segment.id
            f, late_n, c = tally.counts.get(seg, [0, 0, 0])
            rt.windows.save_checkpoint(
                conn, name, seg, Checkpoint(end, closes.latest, definition, f, late_n, c)
            )
            app.tokens.store(name, seg, Token(end), owner, conn=conn)

    if rt.db.backend == "sqlite":
        with StagedStates(rt.states, name) as stage, StagedWindows(rt.windows) as windows:
            for wins, late, states, counts, closed, _, _ in fold_rows(folded, rows_bound, name):
                downstream.add(publish_closed(agg, closed))
                check_closed(name, passed, wins)
                windows.add(name, wins, late)
                stage.add([(name, k, t, more, a, by) for k, t, more, a, by in states])
                tally.add(states, counts)
            tally.check(name, inputs)
            downstream.publish()

            def move(conn: Any) -> None:
                windows.move(conn, name)
                finish(conn)

            stage.replace([name], move)
        return tally.keys
    with rt.db.transaction() as conn:
        rt.states.delete_all(conn, name)
        rt.windows.delete_all(conn, name)
        for wins, late, states, counts, closed, _, _ in fold_rows(folded, rows_bound, name):
            downstream.add(publish_closed(agg, closed))
            check_closed(name, passed, wins)
            rt.windows.save_encoded(conn, name, wins)
            rt.windows.add_late(conn, name, late)
            rt.states.save_encoded(conn, name, states)
            tally.add(states, counts)
        tally.check(name, inputs)  # raised: rolled back
        downstream.publish()
        finish(conn)
    return tally.keys
