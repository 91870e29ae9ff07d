"""Windowed aggregations kept up to date on Spark: the micro-batches of ``eventlanes run
--engine spark`` (:class:`~.continuous.ContinuousAggregation`) for an aggregation with
``window=``.

A micro-batch folds the events after the segments' common token as a replay folds them
(:mod:`.windows`), from what the store holds instead of from nothing:

- the store's clock starts where the newest clock row at or below the token left it, and the
  events between that row and the token are read for the clock alone;
- each key's inputs are folded on an executor onto its stored entry (its dedupe marks, its
  own clock) and its open windows, read there (a late input that amends reads the closed
  window it amends); only the windows the batch changed, closed or amended come back;
- the open windows of keys with no input in the batch that the clock passed are closed by the
  driver, each at the position where the clock reached its end plus the lateness (the same
  :class:`~.window_fold.Closes` the executors read);
- the closed windows are published, folded into the downstream stages and given to
  ``on_close`` before anything commits; then windows, late inputs, entries, stage states,
  every segment's clock row (its counts added to), the windows closed longer than ``retain``
  (as the local engine expires them) and every token commit in one transaction.

What the local engine writes at the end of a batch is what a micro-batch writes: the tests
hold the two to each other. With ``idle_close``, the driver appends the ticks (as a worker
of the local engine does) when a trigger finds nothing new and windows are open. Taken for
tumbling and hopping windows; the rest is refused before any work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..db import Database, open_database
from ..errors import InvalidInputError, SparkJobError
from ..processing.aggregating.aggregation import Aggregation
from ..processing.tables.states import Entry, StateTable, decode
from ..processing.tables.windows import Checkpoint, Win, WindowTable
from ..tokens import Token
from ..windows.kinds import Hopping, Tumbling
from ..windows.spec import Windowing
from .input import check_read
from .source import read_events
from .window_fold import OUT_SCHEMA, TIMED_SCHEMA, Closes, WindowFold, fold_windows, timed
from .windows import (
    BUCKETS_PER_PARTITION,
    Downstream,
    Part,
    Tally,
    clock_columns,
    fold_rows,
    publish_closed,
)

__all__ = ["StoredWindows", "fold_window_batch", "refuse_continuous"]


def refuse_continuous(agg: Aggregation) -> None:
    """What a continuous run does not fold of a windowed aggregation, refused before any work."""
    spec = agg.windowing
    if spec is None:
        return
    if not isinstance(spec.window, Tumbling | Hopping):  # upcasts: refused by refuse_windows
        why = f"its windows are {type(spec.window).__name__.lower()} windows"
        raise InvalidInputError(
            f"aggregation {agg.name!r} is windowed and {why}: a continuous Spark run folds "
            "tumbling and hopping windows (run it with --engine local, or replay it with "
            "el.spark.replay)"
        )


@dataclass
class StoredWindows:
    """Opens, in an executor, what a fold reads of the store (picklable)."""

    url: str
    name: str

    def open(self) -> _Reader:
        return _Reader(self.name, open_database(self.url, create=False))  # reads only


class _Reader:
    """Each key's stored entry and open windows, and the closed windows late inputs amend,
    read on one database of an executor's fold."""

    def __init__(self, name: str, db: Database) -> None:
        self.name, self.db = name, db
        self.states, self.windows = StateTable(db), WindowTable(db)

    def load(self, keys: list[str]) -> dict[str, tuple[Entry, dict[int, Win]]]:
        with self.db.connection() as conn:
            entries = self.states.load(conn, self.name, keys)
            wins = self.windows.open_of(conn, self.name, keys)
        return {key: (entries.get(key, Entry({})), wins.get(key, {})) for key in keys}

    def closed(self, key: str, start: int) -> Win | None:
        with self.db.connection() as conn:
            return self.windows.load_closed(conn, self.name, key, start)

    def close(self) -> None:
        self.db.close()


def _level(name: str, current: dict[int, Token]) -> int:
    """The segments' common position: a store clock's windows fold one range for all."""
    positions = sorted({t.position for t in current.values()})
    if len(positions) != 1 or not all(t.is_plain and not t.sources for t in current.values()):
        raise InvalidInputError(
            f"aggregation {name!r} is windowed and its segments are at different positions "
            f"({', '.join(map(str, positions))}): let the local engine bring them level "
            "(eventlanes run --engine local until caught up), or replay it with el.spark.replay"
        )
    return positions[0]


def _passed(
    runner: Any, fold: WindowFold, closes: Closes, batch_keys: set[str]
) -> list[tuple[Any, ...]]:
    """The open windows of keys with no input in the batch that the clock passed: (key,
    start, end, value text, closed_at, revision), each closed where the clock reached it."""
    spec = fold.spec
    window = spec.window
    assert isinstance(window, Tumbling | Hopping)  # refuse_continuous
    if closes.latest is None:
        return []
    rt = runner.app.runtime
    with rt.db.connection() as conn:
        stored = rt.windows.open_ending(conn, fold.name, closes.latest - spec.lateness)
    passed = []
    for key, start, end, text, revision in stored:
        if key in batch_keys:  # folded, and closed, by its executor
            continue
        at = closes.closed_at((start - window.offset) // window.step)
        if at is None:  # passed before the batch, yet open: nothing written
            raise SparkJobError(
                f"{fold.name}: the window of key {key!r} starting at {start} is open but the "
                "clock passed it before this micro-batch: nothing was written"
            )
        passed.append((key, start, end, text, at, revision))
    return passed


def _expire_keys(conn: Any, rt: Any, name: str, spec: Windowing, parts: list[Part]) -> None:
    """With each key's clock: the closed windows of each key whose windows the batch wrote
    that its clock passed longer than ``retain`` ago, as the local engine's writes delete."""
    written = {w[0] for part in parts for w in part[0]}
    for key, text, *_ in sorted(s for part in parts for s in part[2] if s[0] in written):
        t = decode(text).get("t")
        if t is not None:
            rt.windows.expire_key(conn, name, key, t - spec.lateness - spec.retain)


# long: the batch's jobs, then what the driver closes, publishes and commits, in order
def fold_window_batch(runner: Any, current: dict[int, Token], end: int) -> None:
    """One micro-batch of a windowed aggregation up to ``end`` (see the module's text)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    app, agg = runner.app, runner.agg
    rt, name, spec = app.runtime, agg.name, agg.windowing
    assert spec is not None and isinstance(spec.window, Tumbling | Hopping)  # refused else
    after = _level(name, current)
    with rt.db.connection() as conn:
        # each key's own clock is in its entry: the store's is read from its newest row
        start = rt.windows.clock_at(conn, name, after) if spec.clock == "store" else (after, None)
        checkpoints = {seg: rt.windows.checkpoint(conn, name, seg) for seg in current}
    expected = app.store.count(until=end) - app.store.count(until=start[0])
    df, read = read_events(runner.spark, runner.url, start[0], end, runner.n)
    fold = WindowFold.of(agg, app.store.events_table, [r.segment for r in runner.records])
    timed_df = df.mapInArrow(lambda it: timed(fold, it), TIMED_SCHEMA).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    try:
        buckets = runner.n * BUCKETS_PER_PARTITION
        with_clock, closes, inputs, _ = clock_columns(timed_df, spec, end, buckets, start, after)
        stored = StoredWindows(runner.url, name)
        folded = (
            with_clock.drop("bucket").where(F.col("key").isNotNull() & (F.col("position") > after))
            .repartition(runner.n, "key").sortWithinPartitions("key", "position")
            .mapInArrow(lambda it: fold_windows(fold, closes, it, stored), OUT_SCHEMA)
        )  # fmt: skip
        hops = spec.window.size // spec.window.step  # windows per input at most
        rows = inputs * (2 * hops + 3) + len(current) + 1  # windows twice, a late row, a state
        parts = list(fold_rows(folded, rows, name))
        check_read(name, f"micro-batch ({start[0]:,}, {end:,}] read", read.total(), expected)
    finally:
        timed_df.unpersist()
    tally = Tally()
    for _, _, states, counts, _, dropped in parts:
        tally.add(states, counts, dropped)
    tally.check(name, inputs)
    batch_keys = {s[0] for part in parts for s in part[2]}
    passed = _passed(runner, fold, closes, batch_keys)
    closed = [c for part in parts for c in part[4]]
    if fold.publishes:
        closed += [(k, s, Win(e, decode(text), rev, at)) for k, s, e, text, at, rev in passed]

    def stage_entries(stage: str, keys: list[str]) -> dict[str, Entry]:
        with rt.db.connection() as conn:
            return rt.states.load(conn, stage, keys)

    downstream = Downstream(agg, stage_entries)
    downstream.add(publish_closed(agg, closed))  # acknowledged before anything commits
    downstream.publish()
    definition = spec.definition()
    with rt.db.transaction() as conn:
        runner.record_batch(conn, end)
        for wins, late, states, _, _, _ in parts:
            rt.windows.save_encoded(conn, name, wins)
            rt.windows.add_late(conn, name, late)
            rt.states.save_encoded(conn, name, states)
        rt.windows.save_encoded(conn, name, passed)
        if spec.clock == "key":  # each written key's windows past its clock and retain
            _expire_keys(conn, rt, name, spec, parts)
        downstream.write(conn, rt.states, rt.store)
        for record in runner.records:  # fenced: a stolen claim fails the whole commit
            seg = record.segment
            cp = checkpoints.get(seg.id) or Checkpoint(after, start[1], definition)
            f, late_n, c = tally.counts.get(seg.id, [0, 0, 0])
            latest = closes.latest if closes.latest is not None else cp.latest
            if latest is not None and spec.clock == "store":  # as the local engine's writes
                rt.windows.expire(conn, name, latest - spec.lateness - spec.retain, seg)
            moved = Checkpoint(end, latest, definition, cp.folded + f, cp.late + late_n,
                               cp.clamped + c)  # fmt: skip
            rt.windows.save_checkpoint(conn, name, seg.id, moved)
            token = current.get(seg.id, Token(0)).advance(end)
            app.tokens.store(name, seg.id, token, runner.owner, conn=conn)
