"""What executors run of a windowed aggregation's Spark replay: each read row's time and key
(:func:`timed`), then each key's inputs, in position order, deduped and folded by the local
engine's rules into its windows (:func:`fold_windows`), late inputs, entry and counts, as rows
of :data:`OUT_SCHEMA`. :mod:`.windows` plans the jobs and writes what comes back.

Tumbling and hopping windows close where the store's clock (:class:`Closes`, on their grid)
or the key's own says. A session's end is known only once its key is folded, and calendar
windows are on no grid, so with the store's clock their rows come back open (``c`` null) when
the clock has passed them, and the driver fills in where they closed
(:func:`.windows.closes_by_end`).
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain, groupby, islice
from typing import Any, Protocol

from ..events import Event, datas
from ..hashing import stable_hash
from ..processing.aggregating.aggregation import Aggregation
from ..processing.aggregating.dedupe import dedupe
from ..processing.aggregating.folds import fold_event
from ..processing.aggregating.keying import Keying
from ..processing.tables.states import Entry, encode, encode_dropped_by, encode_state
from ..processing.tables.windows import Win
from ..processing.windowing.clock import recorded_us
from ..processing.windowing.sessions import join_session, merge_of
from ..windows.kinds import Hopping, Session, Tumbling
from ..windows.spec import Windowing
from ..windows.ticks import TICK
from ..windows.time import clamped
from .source import FIELDS, SCHEMA

#: the read's rows with each clock input's clamped time (null: none valid), whether it was
#: clamped, and the key of those folded (null: a tick, or a type only the clock reads)
TIMED_SCHEMA = SCHEMA + ", t long, clamped boolean, key string"
#: a fold's rows: ``window`` (a = start, b = end, c = closed_at, d = revision, text = value),
#: ``published`` (a closed window to publish: a = start, b = end, c = its root's position,
#: d = revision, text = value),
#: ``late`` (a = position, b = t, c = amended, d = recorded_at, text = its windows), ``state``
#: (a = dropped, text = value, more = offsets, by = dropped_by), ``count`` (a = segment,
#: b = folded, c = late, d = clamped) and, folding onto stored windows, ``drop`` (a = the
#: start of a stored session merged into another or moved earlier: its row is deleted)
OUT_SCHEMA = (
    "kind string, key string, a long, b long, c long, d long, text string, more string, by string"
)
OUT_NAMES = OUT_SCHEMA.replace(",", "").split()[::2]
_T, _CLAMPED, _KEY, _BEFORE = 8, 9, 10, 11  # columns after the event's own eight


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
    #: closed windows come back as "published" rows too (for a sink, stages, on_close)
    publishes: bool = False
    merge: Callable[[Any, Any], Any] | None = None  # sessions: two states an input bridges

    @classmethod
    def of(cls, agg: Aggregation, source: str, segments: list[Any]) -> WindowFold:
        assert agg.windowing is not None
        held = tuple((s.mask, s.id) for s in segments)
        merge = merge_of(agg)
        feeds = agg.publish is not None or bool(agg.stages or agg.closers)
        return cls(agg.name, source, agg.windowing, agg.read_types(), Keying.of(agg),
                   agg.initial_state, held, feeds, merge)  # fmt: skip

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


KEYS_PER_LOAD = 500  # keys whose stored windows one continuous fold reads at a time


class StoredReader(Protocol):
    """What a continuous run's fold reads of the store (an executor's connection)."""

    def load(self, keys: list[str]) -> dict[str, tuple[Entry, dict[int, Win]]]:
        """Each key's stored entry and open windows."""

    def closed(self, key: str, start: int) -> Win | None:
        """A closed window a late input amends (None: not kept)."""

    def closed_sessions(self, key: str, low: int, high: int) -> list[tuple[int, int]]:
        """The closed sessions ``(start, end)`` of ``key`` that overlap ``[low, high)``."""

    def close(self) -> None: ...


class Stored(Protocol):
    """Opens a :class:`StoredReader` in an executor (picklable)."""

    def open(self) -> StoredReader: ...


def fold_windows(
    fold: WindowFold, closes: Closes, batches: Iterator[Any], stored: Stored | None = None
) -> Iterator[Any]:
    """Rows sorted by (key, position), of ``TIMED_SCHEMA`` plus ``before`` (the store clock's
    time before each; null with a key's clock): each key folded as the local engine folds it,
    from nothing (a replay) or from what ``stored`` loads (a continuous run's micro-batch)."""
    out: list[tuple[Any, ...]] = []
    counts: dict[int, list[int]] = {}
    rows = chain.from_iterable(zip(*(b.column(i).to_pylist() for i in range(b.num_columns)),
                                   strict=True) for b in batches)  # fmt: skip
    groups = ((key, list(group)) for key, group in groupby(rows, key=lambda r: r[_KEY]))
    reader = stored.open() if stored is not None else None
    try:
        while chunk := list(islice(groups, KEYS_PER_LOAD if reader is not None else 1)):
            loaded = reader.load([key for key, _ in chunk]) if reader is not None else None
            for key, group in chunk:
                start = None if loaded is None else loaded.get(key, (Entry({}), {}))
                _KeyFold(fold, key, group, closes, start, reader).emit(out, counts)
            if len(out) >= 5000:
                yield _batch(out)
    finally:
        if reader is not None:
            reader.close()
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
    ``WindowExecutor._fold_windows`` over a key whose windows are all in hand. ``stored``: its
    entry and open windows (a continuous run), of which only those this fold changed or closed
    come back (``touched``)."""

    def __init__(
        self,
        fold: WindowFold,
        key: str,
        rows: list[tuple[Any, ...]],
        closes: Closes,
        stored: tuple[Entry, dict[int, Win]] | None = None,
        reader: StoredReader | None = None,
    ) -> None:
        self.fold, self.key, self.rows, self.closes = fold, key, rows, closes
        self.stored, self.reader = stored is not None, reader
        self.entry, self.wins = stored if stored is not None else (Entry({}), {})
        self.dropped_before = self.entry.dropped
        self.touched: set[int] = set()
        #: stored sessions merged into another or moved to an earlier start: rows to delete
        self.dropped: set[int] = set()
        self.late: list[tuple[Any, ...]] = []
        self.folded = self.late_count = self.clamped = 0

    def _accepted(self) -> tuple[Entry, list[Event], list[int]]:
        """The key's entry, its inputs as events, and the indexes of those not duplicates."""
        events = [Event(*r[:_T]) for r in self.rows]
        entry = self.entry
        accepted = dedupe(events, [self.key] * len(events), {self.key: entry}, self.fold.source)
        return entry, events, accepted

    def _time(self, event: Event, row: tuple[Any, ...]) -> int:
        """An input's clamped time (counted when clamped)."""
        t, was = row[_T], row[_CLAMPED]
        if t is None:  # no valid time: the error the local engine stops on, naming it
            spec = self.fold.spec
            t, was = clamped(spec.time.of(event), recorded_us(event), spec.max_future)
        self.clamped += bool(was)
        return int(t)

    def _key_clock(self, book: dict[str, Any], latest: int | None, t: int, at: int) -> None:
        """``clock="key"``: the key's clock moves on to ``t``; what it passes closes at ``at``."""
        if latest is None or t > latest:
            book["t"] = t
            for start, w in self.wins.items():
                if w.closed_at is None and w.end <= t - self.fold.spec.lateness:
                    w.closed_at = at
                    self.touched.add(start)

    # long: one pass per input, its windows, lateness and clock side by side (as the executor)
    def fold_all(self) -> Entry:
        fold, wins = self.fold, self.wins
        spec = fold.spec
        if isinstance(spec.window, Session):
            return self.fold_sessions(spec.window)
        lateness, late_mode, store = spec.lateness, spec.late, spec.clock == "store"
        windows_of, initial = spec.window.windows, fold.initial
        entry, events, accepted = self._accepted()
        book = entry.value
        decl = fold.keying.declaration
        pending: list[tuple[Event, Any]] | None = [] if decl is not None else None
        for i in accepted:
            event, row = events[i], self.rows[i]
            t = self._time(event, row)
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
                self.touched.add(start)
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
            if not store:
                self._key_clock(book, latest, t, event.position)
        if pending:
            self._declared(pending)
        return entry

    def fold_sessions(self, session: Session) -> Entry:
        """Session windows, one input at a time (as ``WindowExecutor._fold_sessions``): it
        joins (and bridges) the open sessions of its key that its own ``[t, t + gap)``
        overlaps, else it opens one; it is late when it overlaps a closed one, or when its
        own would be closed already. A session is closed once the clock before an input
        passed its end (the local engine marks it so at that input's batch end, or earlier)."""
        fold, wins = self.fold, self.wins
        spec = fold.spec
        gap, lateness, store = session.gap, spec.lateness, spec.clock == "store"
        entry, events, accepted = self._accepted()
        book = entry.value
        closed: list[tuple[int, int]] | None = None  # the store's closed sessions, if asked
        for i in accepted:
            event, row = events[i], self.rows[i]
            t = self._time(event, row)
            latest = row[_BEFORE] if store else book.get("t")
            mark = None if latest is None else latest - lateness
            overlapping = sorted((s, w) for s, w in wins.items() if s < t + gap and t < w.end)
            joined = [(s, w) for s, w in overlapping
                      if w.closed_at is None and (mark is None or w.end > mark)]  # fmt: skip
            late = len(joined) < len(overlapping) or (
                not joined and mark is not None and t + gap <= mark
            )
            # folding onto stored windows, the closed ones are in the store: one ended at or
            # before the clock, so only an input before it can overlap one
            if not late and self.reader is not None and mark is not None and t < mark:
                if closed is None:
                    closed = self.reader.closed_sessions(self.key, *self._span(gap))
                late = any(s < t + gap and t < e for s, e in closed)
            if late:
                self.late_count += 1
                if spec.late != "count":
                    self.late.append((event.position, t, [(t, t + gap)], False,
                                      recorded_us(event)))  # fmt: skip
            else:
                self.folded += 1
                merge = fold.merge
                assert merge is not None  # the executor refuses sessions without one
                start, w = join_session(fold.name, self.key, merge, wins, joined, t, gap,
                                        fold.initial)  # fmt: skip
                for s, _ in joined:
                    self.dropped.add(s)
                    self.touched.discard(s)
                self.dropped.discard(start)
                self.touched.add(start)
                self._fold_one(w.value, event)
            if not store:
                self._key_clock(book, latest, t, event.position)
        return entry

    def _span(self, gap: int) -> tuple[int, int]:
        """``[low, high)`` over the key's inputs' own sessions ``[t, t + gap)``."""
        times = [r[_T] for r in self.rows if r[_T] is not None]
        return min(times), max(times) + gap

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
            if w is None and self.reader is not None:  # kept in the store, closed
                w = self.reader.closed(self.key, start)
            if w is None:  # closed with nothing in it: it opens as revision 0, closed
                w = Win(end, self.fold.initial(), -1, event.position)
            self.wins[start] = w
            self._fold_one(w.value, event)
            w.revision += 1
            w.amended_at = event.position
            self.touched.add(start)
        return True

    def emit(self, out: list[tuple[Any, ...]], counts: dict[int, list[int]]) -> None:
        """Fold, close, expire, and add the key's rows to ``out`` and its counts to its
        segment's."""
        entry = self.fold_all()
        fold, key, spec = self.fold, self.key, self.fold.spec
        window: Any = spec.window
        session, grid = isinstance(window, Session), isinstance(window, Tumbling | Hopping)
        # a window off the grid the store's clock passed: closed, where is the driver's to say
        passed = set()
        if spec.clock == "store":
            latest = self.closes.latest
            for start, w in self.wins.items():
                if w.closed_at is not None:
                    continue
                if grid:
                    w.closed_at = self.closes.closed_at((start - window.offset) // window.step)
                    if w.closed_at is not None:
                        self.touched.add(start)
                elif latest is not None and w.end + spec.lateness <= latest:
                    passed.add(start)
        else:
            latest = entry.value.get("t")
        # closed longer than retain (a session: at least its gap): deleted by the local
        # engine's writes, never written here
        retain = max(spec.retain, window.gap) if session else spec.retain
        # (a continuous run writes what it closed: the driver expires it, as the local engine)
        gone = None if latest is None or self.stored else latest - spec.lateness - retain
        for start in sorted(self.wins):
            if self.stored and start not in self.touched and start not in passed:
                continue  # a stored window this batch neither changed nor closed
            w = self.wins[start]
            closed = w.closed_at is not None or start in passed
            # each closed window published once, its latest revision: one write's rule
            published = fold.publishes and closed
            written = not (closed and gone is not None and w.end < gone)
            if not (published or written):
                continue
            text = encode_state(fold.name, key, w.value)
            if published:  # a passed one's root position is the driver's to fill in
                root = w.closed_at if w.amended_at is None else w.amended_at
                out.append(("published", key, start, w.end, root, w.revision, text, None, None))
            if written:
                out.append(("window", key, start, w.end, w.closed_at, w.revision, text, None,
                            None))  # fmt: skip
        for start in sorted(self.dropped) if self.stored else ():
            out.append(("drop", key, start, None, None, None, None, None, None))
        for position, t, missed, amended, recorded in self.late:
            out.append(("late", key, position, t, int(amended), recorded, json.dumps(missed),
                        None, None))  # fmt: skip
        out.append(("state", key, entry.dropped, entry.dropped - self.dropped_before, None, None,
                    encode_state(fold.name, key, entry.value), encode(entry.offsets),
                    encode_dropped_by(entry.dropped_by)))  # fmt: skip
        n = counts.setdefault(fold.segment_of(key), [0, 0, 0])
        n[0] += self.folded
        n[1] += self.late_count
        n[2] += self.clamped
