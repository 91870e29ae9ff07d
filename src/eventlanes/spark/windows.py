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

Session windows, and windows that are published or feed stages, stay on the local engine for
now: refused before any work.

The window start formula as a Spark column (:func:`start_column`) is kept equal to Python's
and SQL's (:mod:`eventlanes.windows.kinds`) on integer microseconds; Spark's own ``window()``
works on TimestampType with the session's rules, and the engines must agree bit for bit.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain, groupby
from typing import Any

from ..errors import InvalidInputError, SparkJobError
from ..events import Event, datas
from ..hashing import stable_hash
from ..processing.aggregating.aggregation import Aggregation
from ..processing.aggregating.dedupe import dedupe
from ..processing.aggregating.folds import fold_event
from ..processing.aggregating.keying import Keying
from ..processing.tables.staging import StagedStates
from ..processing.tables.states import Entry, decode, encode, encode_dropped_by, encode_state
from ..processing.tables.windows import Checkpoint, StagedWindows, Win
from ..processing.windowing.clock import recorded_us
from ..processing.windowing.publish import Closed, closed_windows, window_records
from ..tokens import Token
from ..windows.kinds import Session
from ..windows.spec import Windowing
from ..windows.ticks import TICK
from ..windows.time import clamped
from .input import check_read
from .source import FIELDS, SCHEMA
from .staging import parts_of

#: the read's rows with each clock input's clamped time (null: none valid), whether it was
#: clamped, and the key of those folded (null: a tick, or a type only the clock reads)
TIMED_SCHEMA = SCHEMA + ", t long, clamped boolean, key string"
#: a fold's rows: ``window`` (a = start, b = end, c = closed_at, d = revision, text = value),
#: ``published`` (a closed window to publish: a = start, b = end, c = its root's position,
#: d = revision, text = value, more = its root's out),
#: ``late`` (a = position, b = t, c = amended, d = recorded_at, text = its windows), ``state``
#: (a = dropped, text = value, more = offsets, by = dropped_by) and ``count`` (a = segment,
#: b = folded, c = late, d = clamped)
OUT_SCHEMA = (
    "kind string, key string, a long, b long, c long, d long, text string, more string, by string"
)
OUT_NAMES = OUT_SCHEMA.replace(",", "").split()[::2]
_T, _CLAMPED, _KEY, _BEFORE = 8, 9, 10, 11  # columns after the event's own eight
BUCKETS_PER_PARTITION = 4


def start_column(t: Any, step: Any, offset: Any = 0) -> Any:
    """The start of the ``step``-aligned window holding the long column ``t`` (``step`` and
    ``offset``: integers, or long columns)."""
    from pyspark.sql import functions as F

    def col(v: Any) -> Any:
        return F.lit(int(v)) if isinstance(v, int) else v

    return t - F.pmod(t - col(offset), col(step))


def refuse_windows(proc: Any, continuous: bool = False) -> None:
    """What Spark does not run of a windowed aggregation yet, refused before any work: a
    continuous run, session windows, closed windows given to ``on_close`` or folded
    downstream."""
    if not isinstance(proc, Aggregation) or proc.windowing is None:
        return
    why = None
    if continuous:
        why = "a continuous Spark run does not fold windows yet (el.spark.replay does)"
    elif isinstance(proc.windowing.window, Session):
        why = "session windows run on the local engine only for now"
    elif proc.closers or proc.stages:
        why = (
            "its closed windows feed on_close or downstream stages, which a Spark replay "
            "does not run yet"
        )
    elif proc.upcasters.into(proc.handled_types()) is not None:
        why = "windows do not read upcast events yet"
    if why is not None:
        raise InvalidInputError(
            f"aggregation {proc.name!r} is windowed: {why} (eventlanes run --engine local)"
        )


@dataclass(frozen=True)
class WindowFold:
    """What executors need of a windowed aggregation: functions and names only (it pickles
    without the App)."""

    name: str
    source: str  # the store's events table: an unchained event's root source
    spec: Windowing
    types: frozenset[str] | None  # what the clock reads (the folded types, ticks)
    keying: Keying
    initial: Callable[[], Any]
    segments: tuple[tuple[int, int], ...]  # (mask, id) of each segment
    publishes: bool = False  # closed windows come back as "published" rows too

    @classmethod
    def of(cls, agg: Aggregation, source: str, segments: list[Any]) -> WindowFold:
        assert agg.windowing is not None
        held = tuple((s.mask, s.id) for s in segments)
        return cls(agg.name, source, agg.windowing, agg.read_types(), Keying.of(agg),
                   agg.initial_state, held, agg.publish is not None)  # fmt: skip

    def segment_of(self, key: str) -> int:
        h = stable_hash(key)
        return next(i for mask, i in self.segments if h & mask == i)


def timed(fold: WindowFold, batches: Iterator[Any]) -> Iterator[Any]:
    """The clock's inputs of each batch with their times (as :class:`StoreClock` reads them:
    null where none is valid) and the folded ones' keys (as the local engine keys them)."""
    import pyarrow as pa

    spec, wanted = fold.spec, fold.types
    for batch in batches:
        cols = [batch.column(i).to_pylist() for i in range(len(FIELDS))]
        events = [Event(*row) for row in zip(*cols, strict=True)]
        picked = [i for i, e in enumerate(events) if wanted is None or e.type in wanted]
        if not picked:
            continue
        inputs = [events[i] for i in picked]
        recorded = list(map(recorded_us, inputs))
        times = spec.time.times(inputs)
        if spec.idle_close is not None:  # a tick's time: its recorded_at less the lag
            times = [r - spec.tick_lag if e.type == TICK else t
                     for e, t, r in zip(inputs, times, recorded, strict=True)]  # fmt: skip
        mine, keys, _ = fold.keying.keyed([e for e in inputs if e.type != TICK])
        key_of = dict(zip((e.position for e in mine), keys, strict=True))
        found = [None if t is None else clamped(t, r, spec.max_future)
                 for t, r in zip(times, recorded, strict=True)]  # fmt: skip
        kept = batch.select(list(range(len(FIELDS)))).take(pa.array(picked, pa.int64()))
        extra = [
            pa.array([None if c is None else c[0] for c in found], pa.int64()),
            pa.array([None if c is None else c[1] for c in found], pa.bool_()),
            pa.array([key_of.get(e.position) for e in inputs], pa.string()),
        ]
        yield pa.RecordBatch.from_arrays([*kept.columns, *extra],
                                         names=[*FIELDS, "t", "clamped", "key"])  # fmt: skip


@dataclass(frozen=True)
class Closes:
    """Where the store's clock closes windows: for each step ``k`` of the grid some input's
    time reached (``steps``, increasing), the first position whose time reached the threshold
    of window ``k`` or a later one (``first``: a suffix minimum); ``latest``: the clock at the
    end (None: no time)."""

    steps: list[int]
    first: list[int]
    latest: int | None

    def closed_at(self, step: int) -> int | None:
        """The position where the window of grid step ``step`` closed (None: still open)."""
        i = bisect_left(self.steps, step)
        return self.first[i] if i < len(self.first) else None


def fold_windows(fold: WindowFold, closes: Closes, batches: Iterator[Any]) -> Iterator[Any]:
    """Rows sorted by (key, position), of ``TIMED_SCHEMA`` plus ``before`` (the store clock's
    time before each; null with a key's clock): each key folded as the local engine folds it."""
    out: list[tuple[Any, ...]] = []
    counts: dict[int, list[int]] = {}
    rows = chain.from_iterable(zip(*(b.column(i).to_pylist() for i in range(b.num_columns)),
                                   strict=True) for b in batches)  # fmt: skip
    for key, group in groupby(rows, key=lambda r: r[_KEY]):
        _KeyFold(fold, key, list(group), closes).emit(out, counts)
        if len(out) >= 5000:
            yield _batch(out)
    out += [("count", None, seg, *n, None, None, None) for seg, n in sorted(counts.items())]
    if out:
        yield _batch(out)


def _batch(out: list[tuple[Any, ...]]) -> Any:
    import pyarrow as pa

    types = [pa.string(), pa.string(), *[pa.int64()] * 4, pa.string(), pa.string(), pa.string()]
    cols = zip(*out, strict=True)
    batch = pa.RecordBatch.from_arrays(
        [pa.array(c, type=t) for c, t in zip(cols, types, strict=True)],
        names=OUT_NAMES,
    )
    out.clear()
    return batch


class _KeyFold:
    """One key's inputs folded into its windows, in position order: the rules of
    ``WindowExecutor._fold_windows`` over a key whose windows are all in hand."""

    def __init__(self, fold: WindowFold, key: str, rows: list[tuple[Any, ...]],
                 closes: Closes) -> None:  # fmt: skip
        self.fold, self.key, self.rows, self.closes = fold, key, rows, closes
        self.wins: dict[int, Win] = {}
        self.late: list[tuple[Any, ...]] = []
        self.folded = self.late_count = self.clamped = 0

    # long: one pass per input, its windows, lateness and clock side by side (as the executor)
    def fold_all(self) -> Entry:
        fold, key, wins = self.fold, self.key, self.wins
        spec = fold.spec
        lateness, late_mode, store = spec.lateness, spec.late, spec.clock == "store"
        windows_of, initial = spec.window.windows, fold.initial  # type: ignore[union-attr]
        events = [Event(*r[:_T]) for r in self.rows]
        entry = Entry({})
        accepted = dedupe(events, [key] * len(events), {key: entry}, fold.source)
        book = entry.value
        decl = fold.keying.declaration
        pending: list[tuple[Event, Any]] | None = [] if decl is not None else None
        for i in accepted:
            event, row = events[i], self.rows[i]
            t, was = row[_T], row[_CLAMPED]
            if t is None:  # no valid time: the error the local engine stops on, naming it
                t, was = clamped(spec.time.of(event), recorded_us(event), spec.max_future)
            self.clamped += bool(was)
            latest = row[_BEFORE] if store else book.get("t")
            mark = None if latest is None else latest - lateness
            missed: list[tuple[int, int]] = []
            for start, end in windows_of(t):
                if mark is not None and end <= mark:
                    missed.append((start, end))
                    continue
                w = wins.get(start)
                if w is None:
                    w = wins[start] = Win(end, initial())
                if pending is not None:
                    pending.append((event, w.value))
                else:
                    self._fold_one(w.value, event)
            if missed:
                self.late_count += 1
                if late_mode == "amend" and pending:
                    self._declared(pending)
                amended = late_mode == "amend" and self._amend(event, missed, mark)
                if late_mode != "count":
                    self.late.append((event.position, t, missed, amended, recorded_us(event)))
            else:
                self.folded += 1
            if not store and (latest is None or t > latest):  # the key's own clock
                book["t"] = t
                for w in wins.values():
                    if w.closed_at is None and w.end <= t - lateness:
                        w.closed_at = event.position
        if pending:
            self._declared(pending)
        return entry

    def _fold_one(self, value: Any, event: Event) -> None:
        fold_event(self.fold.name, self.fold.keying.folds, self.key, value, event)

    def _declared(self, pending: list[tuple[Event, Any]]) -> None:
        decl = self.fold.keying.declaration
        assert decl is not None
        picked = [e for e, _ in pending]
        decl.fold_into(picked, datas(picked), [self.key] * len(picked), [v for _, v in pending])
        pending.clear()

    def _amend(self, event: Event, missed: list[tuple[int, int]], mark: int | None) -> bool:
        """A late input folded into the closed windows it missed, each a new revision; False
        past ``retain`` (as ``WindowExecutor._amend``)."""
        if not self.fold.spec.amendable(missed, mark):
            return False
        for start, end in missed:
            w = self.wins.get(start)
            if w is None:  # closed with nothing in it: it opens as revision 0, closed
                w = self.wins[start] = Win(end, self.fold.initial(), -1, event.position)
            self._fold_one(w.value, event)
            w.revision += 1
            w.amended_at = event.position
        return True

    def emit(self, out: list[tuple[Any, ...]], counts: dict[int, list[int]]) -> None:
        """Fold, close, expire, and add the key's rows to ``out`` and its counts to its
        segment's."""
        entry = self.fold_all()
        fold, key, spec = self.fold, self.key, self.fold.spec
        window: Any = spec.window
        if spec.clock == "store":
            latest = self.closes.latest
            for start, w in self.wins.items():
                if w.closed_at is None:
                    w.closed_at = self.closes.closed_at((start - window.offset) // window.step)
        else:
            latest = entry.value.get("t")
        if fold.publishes:  # each closed window once, its latest revision: one write's rule
            done = closed_windows([(key, start, w) for start, w in self.wins.items()])
            for position, i, _, start, w in done:
                out.append(("published", key, start, w.end, position, w.revision,
                            encode_state(fold.name, key, w.value), str(i), None))  # fmt: skip
        # closed longer than retain: deleted by the local engine's writes, never written here
        gone = None if latest is None else latest - spec.lateness - spec.retain
        for start in sorted(self.wins):
            w = self.wins[start]
            if w.closed_at is not None and gone is not None and w.end < gone:
                continue
            out.append(("window", key, start, w.end, w.closed_at, w.revision,
                        encode_state(fold.name, key, w.value), None, None))  # fmt: skip
        for position, t, missed, amended, recorded in self.late:
            out.append(("late", key, position, t, int(amended), recorded, json.dumps(missed),
                        None, None))  # fmt: skip
        out.append(("state", key, entry.dropped, None, None, None,
                    encode_state(fold.name, key, entry.value), encode(entry.offsets),
                    encode_dropped_by(entry.dropped_by)))  # fmt: skip
        n = counts.setdefault(fold.segment_of(key), [0, 0, 0])
        n[0] += self.folded
        n[1] += self.late_count
        n[2] += self.clamped


def _clock_columns(
    timed_df: Any, spec: Windowing, end: int, buckets: int
) -> tuple[Any, Closes, int]:
    """``timed_df`` with ``before`` (the store clock's time before each row's position), where
    the clock closes windows, and how many inputs are folded: two small jobs, their answers
    on the driver."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    bucket = ((F.col("position") - 1) * buckets / F.lit(max(end, 1))).cast("long")
    df = timed_df.withColumn("bucket", bucket)
    found = df.groupBy("bucket").agg(F.max("t"), F.count("key")).collect()
    tops = {r[0]: r[1] for r in found}
    below: list[int | None] = []
    running: int | None = None
    for b in range(buckets):  # the largest time in the buckets before each
        below.append(running)
        top = tops.get(b)
        if top is not None and (running is None or top > running):
            running = top
    window: Any = spec.window
    base = F.element_at(F.array(*[F.lit(v).cast("long") for v in below]),
                        F.col("bucket").cast("int") + 1)  # fmt: skip
    within = F.max("t").over(
        Window.partitionBy("bucket").orderBy("position").rowsBetween(Window.unboundedPreceding, -1)
    )
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
    inputs = sum(r[2] for r in found)
    return df.withColumn("before", F.greatest(base, within)).drop("bucket"), closes, inputs


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
    if spec.clock == "store":
        buckets = n * BUCKETS_PER_PARTITION
        with_clock, closes, expected = _clock_columns(timed_df, spec, source.end, buckets)
    else:  # each key's clock: its own earlier inputs, read in the fold
        with_clock = timed_df.withColumn("before", F.lit(None).cast("long"))
        closes, expected = Closes([], [], None), timed_df.where(F.col("key").isNotNull()).count()
    inputs = with_clock.where(F.col("key").isNotNull())
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
        keys = _write(app, agg, fold, kept, total, expected, source.end, closes, owner, records)
    finally:
        kept.unpersist()
    return events, keys


#: per part: windows, late inputs, states, counts, windows to publish
_Part = tuple[list[Any], list[Any], list[Any], list[Any], Closed]


def _rows(folded: Any, bound: int, name: str) -> Iterator[_Part]:
    """The fold's rows brought over a bounded part at a time: per part its windows (key,
    start, end, value, closed_at, revision), late inputs (position, key, t, windows, amended,
    recorded_at), states (key, value, offsets, dropped, dropped_by), counts (segment,
    folded, late, clamped) and the closed windows to publish (as :func:`closed_windows`
    gives them, each key's in the order of their roots)."""
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
            sorted(((c, int(more), k, a, Win(b, decode(t), d)) for kind, k, a, b, c, d, t, more, _
                    in rows if kind == "published"), key=lambda p: (p[0], p[1], p[2])),
        )  # fmt: skip


class _Tally:
    """What the parts held: the counts per segment, states and their dropped inputs; the
    check that every input read is accounted for."""

    def __init__(self) -> None:
        self.counts: dict[int, list[int]] = {}
        self.keys = self.dropped = 0

    def add(self, states: list[Any], counts: list[Any]) -> None:
        self.keys += len(states)
        self.dropped += sum(s[3] for s in states)
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
    tally = _Tally()
    definition = fold.spec.definition()

    def publish(done: Closed) -> None:  # acknowledged before anything commits
        if agg.publish is not None and done:
            agg.publish.publish(window_records(name, done))

    def finish(conn: Any) -> None:
        for record in records:
            seg = record.segment.id
            f, late_n, c = tally.counts.get(seg, [0, 0, 0])
            rt.windows.save_checkpoint(
                conn, name, seg, Checkpoint(end, closes.latest, definition, f, late_n, c)
            )
            app.tokens.store(name, seg, Token(end), owner, conn=conn)

    if rt.db.backend == "sqlite":
        with StagedStates(rt.states, name) as stage, StagedWindows(rt.windows) as windows:
            for wins, late, states, counts, done in _rows(folded, rows_bound, name):
                publish(done)
                windows.add(name, wins, late)
                stage.add([(name, k, t, more, a, by) for k, t, more, a, by in states])
                tally.add(states, counts)
            tally.check(name, inputs)

            def move(conn: Any) -> None:
                windows.move(conn, name)
                finish(conn)

            stage.replace([name], move)
        return tally.keys
    with rt.db.transaction() as conn:
        rt.states.delete_all(conn, name)
        rt.windows.delete_all(conn, name)
        for wins, late, states, counts, done in _rows(folded, rows_bound, name):
            publish(done)
            rt.windows.save_encoded(conn, name, wins)
            rt.windows.add_late(conn, name, late)
            rt.states.save_encoded(conn, name, states)
            tally.add(states, counts)
        tally.check(name, inputs)  # raised: rolled back
        finish(conn)
    return tally.keys
