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
  :class:`~.window_fold.Closes` the executors read; off a grid, sessions and calendar windows,
  found with the batch's closes by :func:`.windows.closes_by_end`);
- a stored session an input merged into another (or moved to an earlier start) is deleted;
- the closed windows are published, folded into the downstream stages and given to
  ``on_close`` before anything commits; then windows, late inputs, entries, stage states,
  every segment's clock row (its counts added to), the windows closed longer than ``retain``
  (as the local engine expires them) and every token commit in one transaction.

What the local engine writes at the end of a batch is what a micro-batch writes: the tests
hold the two to each other. With ``idle_close``, the driver appends the ticks (as a worker
of the local engine does) when a trigger finds nothing new and windows are open.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..db import Database, open_database
from ..errors import InvalidInputError, SparkJobError
from ..processing.tables.states import Entry, StateTable, decode
from ..processing.tables.windows import Checkpoint, Win, WindowTable
from ..tokens import Token
from ..windows.kinds import Hopping, Session, Tumbling
from ..windows.spec import Windowing
from .input import check_read
from .source import read_events
from .window_fold import (
    OUT_SCHEMA,
    TIMED_SCHEMA,
    Closes,
    WindowFold,
    fold_windows,
    timed,
)
from .windows import (
    BUCKETS_PER_PARTITION,
    Downstream,
    Part,
    Tally,
    check_closed,
    clock_columns,
    closes_by_end,
    fold_rows,
    off_grid,
    publish_closed,
    with_closes,
)

__all__ = ["StoredWindows", "fold_window_batch"]


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

    def closed_sessions(self, key: str, low: int, high: int) -> list[tuple[int, int]]:
        with self.db.connection() as conn:
            return self.windows.closed_of_key(conn, self.name, key, low, high)

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


def _waiting(runner: Any, fold: WindowFold, closes: Closes) -> list[tuple[Any, ...]]:
    """The stored open windows the store's clock passed by the batch's end (key, start, end,
    value text, revision): those of keys with no input in the batch close on the driver."""
    if closes.latest is None:  # no time, or each key's own clock
        return []
    rt = runner.app.runtime
    with rt.db.connection() as conn:
        return rt.windows.open_ending(conn, fold.name, closes.latest - fold.spec.lateness)


def _off_grid(
    runner: Any,
    fold: WindowFold,
    folded: Any,
    clock: tuple[Any, Closes, list[int | None]],
    waiting: list[tuple[Any, ...]],
    bound: int,
) -> tuple[list[Part], dict[tuple[str, int], int]]:
    """The parts of a batch of windows off a grid (sessions, calendar windows), those the
    clock passed with where they closed; and where it closed each of the ``waiting`` ones,
    by (key, start): the thresholds of both found by one job (:func:`.closes_by_end`)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    with_clock, closes, reached = clock
    spec = fold.spec
    schema = "kind string, key string, a long, b long, c long"
    ends = runner.spark.createDataFrame(
        [("stored", key, start, end, None) for key, start, end, _, _ in waiting], schema
    )
    kept = folded.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        candidates = kept.select("kind", "key", "a", "b", "c").unionByName(ends)
        closed = closes_by_end(with_clock, candidates, spec.lateness, closes.latest, reached,
                               ("window", "published", "stored")).persist()  # fmt: skip
        try:
            rows = with_closes(kept, closed.where(F.col("kind") != "stored"))
            parts = list(fold_rows(rows, bound, fold.name))
            found = closed.where(F.col("kind") == "stored").select("key", "a", "closed").collect()
        finally:
            closed.unpersist()
    finally:
        kept.unpersist()
    passed = None if closes.latest is None else closes.latest - spec.lateness
    for part in parts:
        check_closed(fold.name, passed, part[0])
    return parts, {(r[0], r[1]): r[2] for r in found if r[2] is not None}


def _passed(
    fold: WindowFold,
    closes: Closes,
    waiting: list[tuple[Any, ...]],
    batch_keys: set[str],
    found: dict[tuple[str, int], int] | None,
) -> list[tuple[Any, ...]]:
    """The ``waiting`` windows of keys with no input in the batch: (key, start, end, value
    text, closed_at, revision), each closed where the clock reached it (on the grid, or as
    ``found`` off it)."""
    window = fold.spec.window
    passed = []
    for key, start, end, text, revision in waiting:
        if key in batch_keys:  # folded, and closed, by its executor
            continue
        if found is not None:
            at = found.get((key, start))
        else:
            assert isinstance(window, Tumbling | Hopping)  # else off the grid
            at = closes.closed_at((start - window.offset) // window.step)
        if at is None:  # passed before the batch, yet open: nothing written
            raise SparkJobError(
                f"{fold.name}: the window of key {key!r} starting at {start} is open but the "
                "clock passed it before this micro-batch: nothing was written"
            )
        passed.append((key, start, end, text, at, revision))
    return passed


def _retain(spec: Windowing) -> int:
    """How long closed windows are kept past the clock: a closed session at least its gap
    (an input overlapping it is late until then), as the local engine keeps it."""
    window = spec.window
    return max(spec.retain, window.gap) if isinstance(window, Session) else spec.retain


def _expire_keys(conn: Any, rt: Any, name: str, spec: Windowing, parts: list[Part]) -> None:
    """With each key's clock: the closed windows of each key whose windows the batch wrote
    that its clock passed longer than ``retain`` ago, as the local engine's writes delete."""
    written = {w[0] for part in parts for w in part[0]}
    for key, text, *_ in sorted(s for part in parts for s in part[2] if s[0] in written):
        t = decode(text).get("t")
        if t is not None:
            rt.windows.expire_key(conn, name, key, t - spec.lateness - _retain(spec))


# long: the batch's jobs, then what the driver closes, publishes and commits, in order
def fold_window_batch(runner: Any, current: dict[int, Token], end: int) -> None:
    """One micro-batch of a windowed aggregation up to ``end`` (see the module's text)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    app, agg = runner.app, runner.agg
    rt, name, spec = app.runtime, agg.name, agg.windowing
    assert spec is not None
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
        with_clock, closes, inputs, reached = clock_columns(timed_df, spec, end, buckets, start,
                                                            after)  # fmt: skip
        stored = StoredWindows(runner.url, name)
        folded = (
            with_clock.drop("bucket").where(F.col("key").isNotNull() & (F.col("position") > after))
            .repartition(runner.n, "key").sortWithinPartitions("key", "position")
            .mapInArrow(lambda it: fold_windows(fold, closes, it, stored), OUT_SCHEMA)
        )  # fmt: skip
        window = spec.window  # the windows an input falls in, at most
        hops = window.size // window.step if isinstance(window, Tumbling | Hopping) else 1
        # each window twice, a late row, a state, a stored session deleted
        rows = inputs * (2 * hops + 4) + len(current) + 1
        waiting = _waiting(runner, fold, closes)
        found = None
        if off_grid(spec):
            clock = (with_clock, closes, reached)
            parts, found = _off_grid(runner, fold, folded, clock, waiting, rows)
        else:
            parts = list(fold_rows(folded, rows, name))
        check_read(name, f"micro-batch ({start[0]:,}, {end:,}] read", read.total(), expected)
    finally:
        timed_df.unpersist()
    tally = Tally()
    for _, _, states, counts, _, dropped, _ in parts:
        tally.add(states, counts, dropped)
    tally.check(name, inputs)
    batch_keys = {s[0] for part in parts for s in part[2]}
    passed = _passed(fold, closes, waiting, batch_keys, found)
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
        for wins, late, states, _, _, _, drops in parts:
            rt.windows.drop(conn, name, drops)  # before: a session may start there again
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
                rt.windows.expire(conn, name, latest - spec.lateness - _retain(spec), seg)
            moved = Checkpoint(end, latest, definition, cp.folded + f, cp.late + late_n,
                               cp.clamped + c)  # fmt: skip
            rt.windows.save_checkpoint(conn, name, seg.id, moved)
            token = current.get(seg.id, Token(0)).advance(end)
            app.tokens.store(name, seg.id, token, runner.owner, conn=conn)
