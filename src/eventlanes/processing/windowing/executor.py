"""The windowed aggregation executor: each input is folded into the time windows it falls in
that its clock has not closed; late inputs are kept, folded as revisions or counted
(``late=``); windows close as the clock passes their end plus the lateness; windows, late
inputs, the clock and the counts are written in the transaction of the segment's token.

A key's row in the states table keeps what dedupes its inputs (their source chains) and, with
``clock="key"``, the largest time of its inputs; its windows are rows of their own
(:mod:`eventlanes.processing.tables.windows`). A held segment keeps its open windows in
memory (loaded when it is claimed); closed ones stay until they are written.
"""

from __future__ import annotations

from operator import itemgetter
from typing import TYPE_CHECKING, Any

from ...errors import InvalidInputError
from ...events import Event, datas
from ...windows.kinds import Hopping, Session, Tumbling
from ...windows.time import clamped
from ..aggregating.aggregation import Aggregation
from ..aggregating.dedupe import dedupe
from ..aggregating.executor import AggregationExecutor
from ..aggregating.folds import fold_event, returned_value
from ..aggregating.pushdown.base import Folded, marked
from ..segment import Outcome, SegmentState
from ..tables.states import Entry
from ..tables.windows import Checkpoint, Win
from .clock import StoreClock, recorded_us
from .ends import Ends
from .publish import closed_windows, on_close, stage_outputs, window_records
from .pushdown import WindowRange
from .sessions import join_session, merge_of
from .ticker import Ticker

if TYPE_CHECKING:
    from ..runtime import Runtime


#: a window group's key and start (:class:`.pushdown.WindowRange`)
_KEY_START = itemgetter(0, 1)
_KEY = itemgetter(0)


class WindowExecutor(AggregationExecutor):
    def __init__(self, runtime: Runtime, agg: Aggregation, owner: str) -> None:
        super().__init__(runtime, agg, owner)
        spec = agg.windowing
        assert spec is not None
        self.spec = spec
        self.windows = runtime.windows
        self.definition = spec.definition()
        ran = self.windows.definitions(agg.name)
        spec.refuse_other(agg.name, agg.version, ran)
        # states without clock rows: it ran without windows (a windowed write has both)
        if not ran and runtime.states.any_of(agg.name):
            raise InvalidInputError(
                f"aggregation {agg.name!r} ran without windows (its states are keyed): with "
                f"window= it is a new version (version={agg.version + 1})"
            )
        if agg.upcasters.into(agg.handled_types()) is not None:
            raise InvalidInputError(
                f"aggregation {agg.name!r}: windows do not read upcast events yet (an "
                "upcaster turns older types into the types it folds)"
            )
        #: session windows: how two sessions an input bridges merge their states
        self.session = spec.window if isinstance(spec.window, Session) else None
        self.merge: Any = merge_of(agg)
        self.fresh_state = dict  # a key's row: its clock (clock="key") besides its offsets
        self.window_initial = agg.initial_state
        self.clock = None
        if spec.clock == "store":
            self.clock = StoreClock(runtime.store, agg.read_types(), spec, self._clock_start)
        self.ticker = None
        if spec.idle_close is not None:
            self.ticker = Ticker(runtime.store, spec.idle_close, agg.name)
        # per held segment id: open (and closed, not yet written) windows by key and start,
        # the open windows by end (the store clock closes the earliest first), the windows
        # changed since the last write, late inputs to write, and the clock row
        self.open: dict[int, dict[str, dict[int, Win]]] = {}
        self.ends: dict[int, Ends] = {}
        self.touched: dict[int, set[tuple[str, int]]] = {}
        #: session windows merged away or moved to an earlier start: rows to delete
        self.dropped_rows: dict[int, set[tuple[str, int]]] = {}
        self.late_rows: dict[int, list[tuple[Any, ...]]] = {}
        self.checkpoints: dict[int, Checkpoint] = {}
        #: how far the batch each segment folds is complete (kept when a segment is let go:
        #: set before its batch, which may start by letting go of an older claim)
        self.uptos: dict[int, int] = {}
        #: per segment, the on_close events of the write under way, by stream
        self.closing: dict[int, list[tuple[str, list[Any]]]] = {}

    def _clock_start(self, position: int) -> tuple[int, int | None]:
        with self.runtime.db.connection() as conn:
            return self.windows.clock_at(conn, self.name, position)

    # -- holding a segment -------------------------------------------------------------------
    def entries_of(self, st: SegmentState) -> dict[str, Entry]:
        entries = super().entries_of(st)
        seg = st.segment.id
        if seg not in self.open:  # a new claim (or a split, a merge): its windows from the table
            with self.runtime.db.connection() as conn:
                rows = self.windows.load_open(conn, self.name, st.segment)
                cp = self.windows.checkpoint(conn, self.name, seg)
            by_key: dict[str, dict[int, Win]] = {}
            ends = Ends()
            for key, start, end, value, revision in rows:
                by_key.setdefault(key, {})[start] = Win(end, value, revision)
                ends.push(end, key, start)
            self.open[seg], self.ends[seg] = by_key, ends
            self.touched[seg], self.late_rows[seg], self.dropped_rows[seg] = set(), [], set()
            self.checkpoints[seg] = cp or Checkpoint(st.token.position, None, self.definition)
        return entries

    def discard(self, seg: int) -> None:
        super().discard(seg)
        if self.clock is not None:
            self.clock.forget(seg)
        kept = (
            self.open, self.ends, self.touched, self.late_rows, self.checkpoints, self.closing,
            self.dropped_rows,
        )  # fmt: skip
        for held in kept:
            held.pop(seg, None)

    # -- folding -----------------------------------------------------------------------------
    def process(self, st: SegmentState, events: list[Any], upto: int | dict[str, int]) -> Outcome:
        self.uptos[st.segment.id] = self._upto(upto)
        return super().process(st, events, upto)

    def reached(self, st: SegmentState, upto: int | dict[str, int]) -> None:
        """The windows the batch's clock passed close before the token is written at
        ``upto``: a restart starts its clock from the row written with it, and could not
        place a window left open below it."""
        self._close(st, self._upto(upto))

    def read(self, events: Any, after: int, upto: int | dict[str, int]) -> None:
        if self.ticker is not None and events:
            self.ticker.heard()
        if self.clock is not None and isinstance(upto, int):
            if isinstance(events, WindowRange):
                self.clock.feed_breaks(events.breaks, after, upto)
            elif isinstance(events, list):
                self.clock.feed(events, after, upto)

    def idle(self, st: SegmentState, upto: int | dict[str, int]) -> None:
        if self.clock is not None:
            self.entries_of(st)  # its open windows, loaded if this claim has read nothing yet
            end = self._upto(upto)
            self.clock.cover(st.segment.id, st.token.position, end)
            self._close(st, end)
        super().idle(st, upto)
        self._tick(st)

    def persist_idle(self, st: SegmentState) -> None:
        super().persist_idle(st)
        if self.ticker is not None and not st.lost:
            self.entries_of(st)  # its open windows, loaded if this claim has read nothing yet
        self._tick(st)

    def _tick(self, st: SegmentState) -> None:
        """A tick if the inputs have been quiet for ``idle_close`` and a window of a held
        segment is open (a store with nothing to close gets no ticks); the segment's windows
        are loaded (ticks need the store clock, whose ``idle`` loads them)."""
        if self.ticker is not None and not st.lost and any(self.ends.values()):
            self.ticker.check()

    def _upto(self, upto: int | dict[str, int]) -> int:
        if not isinstance(upto, int):
            raise InvalidInputError(f"aggregation {self.name!r}: windows read one source")
        return upto

    def fold_events(self, st: SegmentState, entries: dict[str, Entry], events: list[Event]) -> None:
        seg = st.segment.id
        mine, keys, _ = self.keyed(events)
        if not mine:
            return
        distinct = set(keys)
        marks = self.load_keys(seg, entries, distinct)
        self.dirtied(seg, distinct)
        accepted = dedupe(mine, keys, entries, self.source, marks)
        st.watch(f"the folds of events {mine[0].position} to {mine[-1].position}")
        try:
            picked = [mine[i] for i in accepted], [keys[i] for i in accepted]
            if self.session is not None:
                self._fold_sessions(st, entries, *picked)
            else:
                self._fold_windows(st, entries, *picked)
        finally:
            st.idle_now()

    def _fold_range(self, st: SegmentState, entries: dict[str, Entry], folded: Folded) -> int:
        """A range folded in SQLite per window (:mod:`.pushdown`): its windows merged into the
        open ones, its late inputs kept, its keys' marks raised; or, when the dedupe fast rule
        does not hold for it, folded again by rows (the clock reads it again when asked)."""
        if not isinstance(folded, WindowRange):
            return super()._fold_range(st, entries, folded)
        seg = st.segment.id
        keys = [g[0] for g in folded]
        marks = self.load_keys(seg, entries, keys)
        if folded and not marked(folded, marks, self.source):  # the clock reads it again
            return super()._fold_range(
                st, entries, Folded([], folded.after, folded.upto, folded.reader, exact=False)
            )
        self.dirtied(seg, keys)
        self._merge_windows(seg, folded)
        self.agg.pushed_down += folded.events
        return folded.events

    def _merge_windows(self, seg: int, folded: WindowRange) -> None:
        """The windows of a range folded in SQLite into the open ones (a new one opened, and
        queued to close), its late inputs kept (or counted) and the counts moved on."""
        spec, clock = self.spec, self.clock
        assert clock is not None and isinstance(spec.window, Tumbling | Hopping)  # pushdown
        open_, ends, touched = self.open[seg], self.ends[seg], self.touched[seg]
        initial, size, push = self.window_initial, spec.window.size, ends.push
        states = []
        for g in folded.windows:
            key, start = g[0], g[1]
            mine = open_.get(key)
            if mine is None:
                mine = open_[key] = {}
            w = mine.get(start)
            if w is None:
                w = mine[start] = Win(start + size, initial())
                push(start + size, key, start)
            states.append(w.value)
        touched.update(map(_KEY_START, folded.windows))
        pushdown = folded.reader.pushdown
        assert pushdown is not None  # the one that folded the range
        pushdown.merge_fields(states, folded.windows, 2)
        windows_of, lateness = spec.window.windows, spec.lateness
        if spec.late != "count":
            rows = self.late_rows[seg]
            for position, key, t, recorded, before in folded.late:
                missed = [(s, e) for s, e in windows_of(t) if e <= before - lateness]
                rows.append((position, key, t, missed, False, recorded))
        cp = self.checkpoints[seg]
        cp.late += len(folded.late)
        cp.folded += folded.events - len(folded.late)
        cp.clamped += folded.clamped
        clock.cover(seg, folded.after, folded.upto)  # the segment's floor: what it may ask

    def _times(self, events: list[Event]) -> list[tuple[int, bool]]:
        """Each input's clamped time and whether it was clamped: as the clock read it, or read
        here (an invalid one raises, naming the event: the segment fails on it)."""
        spec, store = self.spec, self.clock
        known = store.times_of([e.position for e in events]) if store is not None else None
        if known is not None and None not in known:
            return known  # type: ignore[return-value]
        return [
            k or clamped(spec.time.of(e), recorded_us(e), spec.max_future)
            for e, k in zip(events, known or [None] * len(events), strict=True)
        ]

    def _clocked(
        self, st: SegmentState, events: list[Event]
    ) -> tuple[list[tuple[int, bool]], list[int | None] | None]:
        """Each input's clamped time and whether it was clamped, and with the store's clock
        the largest time before each (None: each key's own clock, kept in its row)."""
        timed = self._times(events)
        if self.clock is None:
            return timed, None
        seg = st.segment.id
        after, upto = st.token.position, self.uptos[seg]
        return timed, self.clock.before(seg, after, upto, [e.position for e in events])

    def _key_clock_moves(
        self, seg: int, key: str, book: dict[str, Any], t: int, position: int
    ) -> None:
        """``clock="key"``: the key's clock moves on to ``t``; its open windows that it
        passed close at ``position``."""
        book["t"] = t
        for start, w in self.open[seg][key].items():
            if w.closed_at is None and w.end <= t - self.spec.lateness:
                w.closed_at = position
                self.touched[seg].add((key, start))

    # long: one pass per input, its windows, lateness and clock side by side
    def _fold_windows(
        self, st: SegmentState, entries: dict[str, Entry], events: list[Event], keys: list[str]
    ) -> None:
        spec, seg = self.spec, st.segment.id
        assert not isinstance(spec.window, Session)  # folded by _fold_sessions
        windows_of, lateness, late_mode = spec.window.windows, spec.lateness, spec.late
        open_, ends, touched = self.open[seg], self.ends[seg], self.touched[seg]
        cp, initial, store = self.checkpoints[seg], self.window_initial, self.clock
        timed, before = self._clocked(st, events)
        folds: dict[str, list[Any]] = {}
        decl = self.agg.declaration
        # a declared aggregation folds a column at a time: (input, window state) pairs, in
        # order, folded at the end (or before an amendment, which must come after them)
        pending: list[tuple[int, Any]] | None = [] if decl is not None else None
        for i, (event, key) in enumerate(zip(events, keys, strict=True)):
            t, was = timed[i]
            if was:
                cp.clamped += 1
            book = entries[key].value
            latest = before[i] if before is not None else book.get("t")
            mark = None if latest is None else latest - lateness
            mine = open_.get(key)
            if mine is None:
                mine = open_[key] = {}
            fs = folds.get(event.type) if pending is None else ()
            if fs is None:
                fs = folds[event.type] = self.agg.folds.for_type(event.type)
            missed = None
            for start, end in windows_of(t):
                if mark is not None and end <= mark:
                    missed = [*(missed or ()), (start, end)]
                    continue
                w = mine.get(start)
                if w is None:
                    w = mine[start] = Win(end, initial())
                    if store is not None:
                        ends.push(end, key, start)
                value = w.value
                if pending is not None:
                    pending.append((i, value))
                for fold in fs:
                    if (produced := fold(value, event)) is not None and produced is not value:
                        returned_value(self.name, key, event, fold, produced)
                touched.add((key, start))
            if missed:
                cp.late += 1
                if late_mode == "amend" and pending:
                    self._fold_declared(events, keys, pending)
                amended = late_mode == "amend" and self._amend(seg, key, event, missed, mark)
                if late_mode != "count":
                    row = (event.position, key, t, missed, amended, recorded_us(event))
                    self.late_rows[seg].append(row)
            else:
                cp.folded += 1
            if store is None and (latest is None or t > latest):  # the key's own clock
                self._key_clock_moves(seg, key, book, t, event.position)
        if pending:
            self._fold_declared(events, keys, pending)

    def _fold_sessions(
        self, st: SegmentState, entries: dict[str, Entry], events: list[Event], keys: list[str]
    ) -> None:
        """Session windows, one input at a time: it joins (and bridges) the open sessions of
        its key that its own ``[t, t + gap)`` overlaps, else it opens one, or it is late when
        that is closed already (as :mod:`eventlanes.windows.reference` says)."""
        spec, seg = self.spec, st.segment.id
        assert self.session is not None
        gap, lateness, store = self.session.gap, spec.lateness, self.clock
        open_, cp = self.open[seg], self.checkpoints[seg]
        timed, before = self._clocked(st, events)
        spans: dict[str, tuple[int, int]] = {}  # each key's inputs' [t, t + gap), all of them
        for (t, _), key in zip(timed, keys, strict=True):
            lo, hi = spans.get(key, (t, t + gap))
            spans[key] = (min(lo, t), max(hi, t + gap))
        # the closed sessions of the table these inputs may overlap, read once when one needs
        # them; this call's own (segments of one executor fold on threads of their own)
        stored: list[dict[str, list[tuple[int, int]]]] = []
        for i, (event, key) in enumerate(zip(events, keys, strict=True)):
            t, was = timed[i]
            if was:
                cp.clamped += 1
            book = entries[key].value
            latest = before[i] if before is not None else book.get("t")
            mark = None if latest is None else latest - lateness
            mine = open_.setdefault(key, {})
            # the open sessions it overlaps: one the clock passed is closed, though it is
            # marked so only after the batch (:meth:`_close`)
            joined = sorted(
                (s, w) for s, w in mine.items() if w.closed_at is None and s < t + gap
                and t < w.end and (mark is None or w.end > mark)
            )  # fmt: skip
            late = not joined and mark is not None and t + gap <= mark
            if late or self._in_closed(seg, key, t, mark, spans, stored):  # closed: no overlap
                cp.late += 1
                if spec.late != "count":
                    row = (event.position, key, t, [(t, t + gap)], False, recorded_us(event))
                    self.late_rows[seg].append(row)
            else:
                cp.folded += 1
                self._fold_one(self._join(seg, key, joined, t).value, event, key)
            if store is None and (latest is None or t > latest):  # the key's own clock
                self._key_clock_moves(seg, key, book, t, event.position)

    def _in_closed(
        self,
        seg: int,
        key: str,
        t: int,
        mark: int | None,
        spans: dict[str, tuple[int, int]],
        stored: list[dict[str, list[tuple[int, int]]]],
    ) -> bool:
        """An input at ``t`` overlaps a closed session of ``key`` (its own ``[t, t + gap)``
        does): held here (closed, or passed by the clock, not written yet), or in the table
        (read into ``stored`` once per batch, for the keys' ``spans``). A closed session ended
        at or before the clock (``mark``): an input at or past it overlaps none, and most
        inputs are (the table is read only for the others)."""
        assert self.session is not None
        if mark is None or t >= mark:
            return False
        hi = t + self.session.gap
        for s, w in self.open[seg].get(key, {}).items():
            passed = w.closed_at is not None or w.end <= mark
            if passed and s < hi and t < w.end:
                return True
        if not stored:
            with self.runtime.db.connection() as conn:
                stored.append(self.windows.closed_within(conn, self.name, spans))
        return any(s < hi and t < e for s, e in stored[0].get(key, ()))

    def _join(self, seg: int, key: str, joined: list[tuple[int, Win]], t: int) -> Win:
        """The session of ``key`` that now holds an input at ``t``: a new one, or the
        ``joined`` ones (in time order) merged into the first, spanning them and ``t``; the
        rows of the starts it no longer has are deleted with the next write."""
        assert self.session is not None and self.merge is not None
        mine, dropped = self.open[seg][key], self.dropped_rows[seg]
        start, w = join_session(self.name, key, self.merge, mine, joined, t, self.session.gap,
                                self.window_initial)  # fmt: skip
        for s, _ in joined:
            dropped.add((key, s))
            self.touched[seg].discard((key, s))
        dropped.discard((key, start))
        self.touched[seg].add((key, start))
        if self.clock is not None:
            self.ends[seg].push(w.end, key, start)
        return w

    def _fold_declared(
        self, events: list[Event], keys: list[str], pending: list[tuple[int, Any]]
    ) -> None:
        """Fold the ``pending`` (input index, window state) pairs a column at a time, then
        forget them."""
        assert self.agg.declaration is not None
        picked = [events[i] for i, _ in pending]
        self.agg.declaration.fold_into(
            picked, datas(picked), [keys[i] for i, _ in pending], [v for _, v in pending]
        )
        pending.clear()

    def _fold_one(self, value: Any, event: Event, key: str) -> None:
        fold_event(self.name, self.agg.folds, key, value, event)

    def _amend(
        self, seg: int, key: str, event: Event, missed: list[tuple[int, int]], mark: int | None
    ) -> bool:
        """Fold a late input into the closed windows it missed, each a new revision; False
        when they are past ``retain`` (then it is only kept in the late table)."""
        if not self.spec.amendable(missed, mark):
            return False
        mine = self.open[seg].setdefault(key, {})
        for start, end in missed:
            w = mine.get(start)
            if w is None:
                with self.runtime.db.connection() as conn:
                    w = self.windows.load_closed(conn, self.name, key, start)
                if w is None:  # closed with nothing in it: it opens as revision 0, closed
                    w = Win(end, self.window_initial(), -1, event.position)
                mine[start] = w
            self._fold_one(w.value, event, key)
            w.revision += 1
            w.amended_at = event.position
            self.touched[seg].add((key, start))
        return True

    def _close(self, st: SegmentState, upto: int) -> None:
        """Close the open windows the store clock passed at ``upto``, each at the position
        where it did."""
        seg = st.segment.id
        if self.clock is None or seg not in self.open:
            return
        lateness = self.spec.lateness
        latest = self.clock.at(upto)
        if latest is None:
            return
        open_, touched = self.open[seg], self.touched[seg]
        for end, members in self.ends[seg].through(latest - lateness):
            point = None  # the first position where the clock passed this end
            for key, start in members:
                w = open_.get(key, {}).get(start)
                if w is None or w.closed_at is not None or w.end != end:
                    continue  # a session's end moved later: a newer entry is queued
                if point is None:
                    point = self.clock.reached(upto, [end + lateness])[0]
                w.closed_at = point
                touched.add((key, start))
                st.dirty = True
        self.clock.trim()

    # -- writing -----------------------------------------------------------------------------
    def publish(self, st: SegmentState, entries: Any, changed: Any, offsets: Any) -> None:
        """Each window closed or amended since the last write (open ones are not): folded by
        the downstream stages and published (``publish=``) before the write commits, and given
        to the ``on_close`` functions, whose events the write appends."""
        seg = st.segment.id
        agg = self.agg
        self.closing.pop(seg, None)
        if seg not in self.open or (agg.publish is None and not agg.closers and not agg.stages):
            return
        open_ = self.open[seg]
        done = closed_windows([(k, s, open_[k][s]) for k, s in self.touched[seg]])
        if agg.stages and done:  # downstream first, in a transaction of their own
            self.outputs.setdefault(seg, []).extend(stage_outputs(self.name, agg.stages, done))
            self._flush_downstream(seg)
        if agg.publish is not None:
            agg.publish.publish(window_records(self.name, done))
        if agg.closers:
            self.closing[seg] = on_close(self.name, agg.closers, done)

    def write_more(self, conn: Any, st: SegmentState) -> None:
        seg = st.segment.id
        if seg not in self.open:
            return
        open_, spec = self.open[seg], self.spec
        self.windows.drop(conn, self.name, sorted(self.dropped_rows[seg]))
        # in key order, as the table's rows lie (by key alone: four times faster to sort)
        touched = sorted(self.touched[seg], key=_KEY)
        rows = [(key, start, open_[key][start]) for key, start in touched]
        self.windows.save(conn, self.name, rows)
        self.windows.add_late(conn, self.name, self.late_rows[seg])
        if runs := self.closing.pop(seg, None):  # on_close's events, with the windows
            self.runtime.store.append_runs(runs, conn=conn)
        cp = self.checkpoints[seg]
        cp.position = st.token.position
        # a closed session is kept at least its gap behind the clock: an input overlapping it
        # (late: :meth:`_in_closed`) can come until then
        retain = spec.retain if self.session is None else max(spec.retain, self.session.gap)
        if self.clock is not None:
            cp.latest = self.clock.at(st.token.position)
            if cp.latest is not None:
                before = cp.latest - spec.lateness - retain
                self.windows.expire(conn, self.name, before, st.segment)
        else:
            keys = {key for key, _ in self.touched[seg]}
            entries = self.entries.get(seg, {})
            for key in sorted(keys):
                t = entries[key].value.get("t") if key in entries else None
                if t is not None:
                    before = t - spec.lateness - retain
                    self.windows.expire_key(conn, self.name, key, before)
        self.windows.save_checkpoint(conn, self.name, seg, cp)

    def written(self, st: SegmentState, seconds: float) -> None:
        seg = st.segment.id
        if seg in self.open:
            open_ = self.open[seg]
            for key, start in self.touched[seg]:  # closed and written: read from the table
                mine = open_.get(key)
                if mine is not None and start in mine and mine[start].closed_at is not None:
                    del mine[start]
                    if not mine:
                        del open_[key]
            self.touched[seg], self.dropped_rows[seg] = set(), set()
            self.late_rows[seg] = []
        super().written(st, seconds)
