"""The aggregation executor: folds a segment's events into cached states, persists them conflated,
downstream first.
"""

from __future__ import annotations

import logging
import operator
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from itertools import repeat
from typing import TYPE_CHECKING, Any

from ...errors import ClaimLostError, InvalidInputError
from ...events import Event, NewEvent, types
from ...lineage import Coordinates, coordinates
from ...segments import Segment
from ...tracing import spans
from ..executors.base import Executor
from ..handling.failures import describe
from ..segment import Outcome, SegmentState, advanced
from ..tables.states import Entry, encode_all
from .aggregation import Aggregation, Fold, Stage
from .cache import StateCache
from .dedupe import Marks, dedupe
from .downstream import by_stage, fold_downstream
from .folds import check_fresh_state, check_output, not_awaitable, returned_value
from .keying import Keying
from .publish import Offsets, publish_states
from .pushdown import base as ranges
from .pushdown.base import Folded, Pending

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from ..runtime import Runtime


class AggregationExecutor(Executor):
    """Folds a segment's batches into states held in memory; writes the states changed since
    the last write, with the segment's token, every ``persist_every`` seconds.

    States stay in memory after a write while the segment is held as it was: they equal the
    stored rows, since only the claim's holder writes them. A segment split, merged, released
    or lost starts from the table again. The states cached take ``state_cache_bytes`` at most
    (estimated: :class:`StateCache`), shared evenly by the segments held: past it, states written
    and unchanged since are dropped, the oldest first; when the changed ones alone fill it,
    they are written at once, without waiting for ``persist_every``."""

    def __init__(self, runtime: Runtime, agg: Aggregation, owner: str) -> None:
        super().__init__(runtime, agg, owner)
        self.agg = agg
        self.keying = Keying.of(agg)
        self.table = agg.states
        self.source = runtime.store.events_table
        # Per segment id: the states known (clean and dirty), the keys changed since the last
        # write, and for which held segment they are valid. The segment's in-memory token runs
        # ahead of the stored one until the next write (states + token).
        self.entries: dict[int, dict[str, Entry]] = {}
        self.marks: dict[int, Marks] = {}  # what dedupe knows of the entries' offsets
        self.changed: dict[int, set[str]] = {}
        self.caches: dict[int, StateCache] = {}  # the entries' estimated bytes
        self.budget = agg.state_cache_bytes
        self.fresh_chars: int | None = None  # the JSON text of initial(), measured once
        #: a key's fresh state (a windowed aggregation's executor keeps its windows apart)
        self.fresh_state: Callable[[], Any] = agg.initial_state
        self.holder: dict[int, tuple[SegmentState, Segment]] = {}
        self.holding = threading.Lock()  # segments' threads change holders, and drop others'
        self.flushed_at: dict[int, float] = {}
        self.outputs: dict[int, list[tuple[Stage, Coordinates, NewEvent, Event]]] = {}
        self.persist_every = agg.persist_every
        #: run in the pooled loop's rounds: due writes wait for :meth:`end_round`, merged
        self.rounds = agg.mode == "pooled"
        if not agg.stages:  # all stages are declared by now: the app starts
            check_fresh_state("aggregation", agg.name, agg.initial_state)
        if agg.windowing is None and (ran := runtime.windows.definitions(agg.name)):
            raise InvalidInputError(
                f"aggregation {agg.name!r} ran with windows ({sorted(ran)[0]}): without them "
                f"it is a new version (version={agg.version + 1})"
            )
        decl = agg.declaration
        self.types = decl.types if decl is not None else None

    def traced_events(self, events: Any) -> tuple[list[Event], int, int | None, int | None]:
        """A range folded in SQLite has no events in Python to link: its count and range."""
        if isinstance(events, Folded | Pending):
            return [], events.events, events.after + 1, events.upto
        return events, len(events), None, None

    def trace_attributes(self, events: Any) -> dict[str, Any] | None:
        return {spans.PUSHDOWN: isinstance(events, Folded | Pending)}

    def entries_of(self, st: SegmentState) -> dict[str, Entry]:
        seg = st.segment.id
        with self.holding:
            if self.holder.get(seg) != (st, st.segment):  # another claim, or split: from the table
                self.discard(seg)
                for other, (_, held) in list(self.holder.items()):
                    if held.overlaps(st.segment):  # split or merged: let go before this claim
                        self.discard(other)
                self.holder[seg] = (st, st.segment)
                self.caches[seg] = StateCache()
            return self.entries.setdefault(seg, {})

    def keyed(self, events: list[Event]) -> tuple[list[Event], list[str], Any]:
        """The events folded, their keys and, for a declared aggregation, their data."""
        return self.keying.keyed(events)

    def process(self, st: SegmentState, events: list[Any], upto: int | dict[str, int]) -> Outcome:
        """Fold ``events`` (or a range folded in SQL: :class:`~.pushdown.Folded`) and move
        the segment's token to ``upto`` in memory; states and token are written together
        every ``persist_every`` seconds."""
        seg = st.segment.id
        entries = self.entries_of(st)
        self.flushed_at.setdefault(seg, time.monotonic())
        parts: Iterable[Any] = (events,)
        if isinstance(events, Pending) or (
            isinstance(events, Folded)
            and events.exact
            and events.reader.pushdown is not None
            and events.reader.pushdown.places_folded
        ):
            placed = self._in_place(st, events)
            if placed is not None:
                return placed
            entries = self.entries_of(st)
            if isinstance(events, Pending):  # merged in memory after all (or by rows)
                parts = events.folds()  # a part at a time
        started = time.perf_counter()
        handled = 0
        try:
            for part in parts:
                if isinstance(part, Folded):
                    handled += self._fold_range(st, entries, part)
                else:
                    handled += len(part)
                    self.fold_events(st, entries, part)
                # A long range, memory bounded: states written before the token (a replay
                # drops them by their offsets).
                full = part is not events and self._full(seg)
                if full and (failed := self._flushed(st)) is not None:
                    return failed
        except Exception as exc:  # noqa: BLE001 - a fold may have half-updated a state
            self._let_go(st)
            return self.back_off(st, exc)
        if st.lost:  # given up on (a fold ran past handler_timeout): nothing of it is written
            self._let_go(st)
            return Outcome.LOST
        seconds = time.perf_counter() - started
        self.observer.batch_handled(self.name, str(st.segment), handled, seconds)
        st.moved(upto)
        st.dirty = True  # states changed: written with the token even if it did not move
        self.reached(st, upto)
        if self._full(seg) or (not self.rounds and self._due(st)):
            self.flush(st)
            if st.lost:
                return Outcome.LOST
        return Outcome.OK

    def reached(self, st: SegmentState, upto: int | dict[str, int]) -> None:
        """A batch is folded and ``st``'s token moved to ``upto`` in memory: what follows from
        the new position happens here, before anything is written with it (windows close)."""

    def _due(self, st: SegmentState) -> bool:
        """Changed, or moved, since the last write, ``persist_every`` ago (never written:
        since its first batch here, so a first catch-up is conflated too)."""
        since = self.flushed_at.get(st.segment.id, st.persisted_at)
        return st.dirty and time.monotonic() - since >= self.persist_every

    def load_keys(self, seg: int, entries: dict[str, Entry], keys: Iterable[str]) -> Marks:
        """Every key of ``keys`` in ``entries`` (read from the table, or fresh); the segment's
        marks, raised to cover the offsets read."""
        marks = self.marks.setdefault(seg, Marks())
        # set.difference(dict) steps through the batch's keys; ``set - dict.keys()`` steps
        # through every cached entry (the view's reflected difference): a cost per batch that
        # grew with the keys held, 26 ms per batch at a million
        missing = sorted(set(keys).difference(entries))
        if missing:
            chars: list[int] = []  # of the texts read: sizes without encoding again
            with self.runtime.db.connection() as conn:
                loaded = self.table.load(conn, self.name, missing, chars=chars)
            marks.saw(loaded.values())
            entries.update(loaded)
            cache = self.caches[seg]
            cache.add(list(loaded), chars)
            initial = self.fresh_state
            fresh = [key for key in missing if key not in entries]
            for key in fresh:
                entries[key] = Entry(initial())
            if fresh:  # offsets: those of one event of the source, as a fold leaves them
                cache.add(fresh, repeat(self._fresh_chars() + len(self.source) + 20, len(fresh)))
        return marks

    def _fresh_chars(self) -> int:
        """The length of ``initial()``'s JSON text (0 if it is not JSON: a fold makes it so)."""
        if self.fresh_chars is None:
            try:
                self.fresh_chars = len(encode_all([self.fresh_state()])[0])
            except (TypeError, ValueError):
                self.fresh_chars = 0
        return self.fresh_chars

    def dirtied(self, seg: int, keys: Iterable[str]) -> None:
        """``keys`` changed: written at the next write, counted as dirty until then."""
        changed = self.changed.setdefault(seg, set())
        new = (keys if isinstance(keys, set) else set(keys)) - changed
        changed |= new
        self.caches[seg].dirtied(new)

    def _full(self, seg: int) -> bool:
        """Drop clean states past the segment's share of the budget; True when the changed
        ones alone fill it (then they are written now)."""
        cache = self.caches.get(seg)
        if cache is None:
            return False
        share = self.budget // max(1, len(self.caches))
        if cache.used > share:
            self._evict(seg, cache, share)
        return cache.dirty >= share

    def _evict(self, seg: int, cache: StateCache, target: int) -> None:
        """Drop states written and unchanged since (they equal their rows), the oldest first,
        until ``cache`` is under ``target`` bytes or only changed ones are left. Their pending
        positions go too: they were written into the rows' offsets, and are read back with
        them (the marks' bounds stay: they may only be above the offsets)."""
        victims = cache.oldest_clean(self.changed.get(seg, set()), cache.used - target)
        deque(map(self.entries.get(seg, {}).pop, victims, repeat(None)), 0)
        cache.used -= sum(map(cache.sizes.pop, victims))
        marks = self.marks.get(seg)
        for last in marks.pending.values() if marks is not None else ():
            deque(map(last.pop, victims, repeat(None)), 0)

    def fold_events(self, st: SegmentState, entries: dict[str, Entry], events: list[Event]) -> None:
        seg = st.segment.id
        mine, keys, rows = self.keyed(events)
        distinct = set(keys)
        marks = self.load_keys(seg, entries, distinct)
        self.dirtied(seg, distinct)
        if mine:  # a batch's folds are bounded by handler_timeout (watched per batch: cheap)
            st.watch(f"the folds of events {mine[0].position} to {mine[-1].position}")
        try:
            if self.agg.declaration is not None:
                self.agg.declaration.fold_batch(mine, keys, entries, self.source, marks, rows)
            else:
                self._fold(mine, keys, entries, self.outputs.setdefault(seg, []), marks)
        finally:
            st.idle_now()

    def _in_place(self, st: SegmentState, pending: Pending | Folded) -> Outcome | None:
        """Merge ``pending`` into the stored states inside the database, with the token, in
        one transaction (:meth:`~.pushdown.base.Pushdown.merge_in_place`), when a write is
        due or the range is long: first the states held here are written (if changed) and
        let go, since the rows change under them. None: the range is merged in memory
        instead (nothing of it was written)."""
        pushdown = pending.reader.pushdown
        seg = st.segment.id
        if (
            pushdown is None
            or pushdown.store.db is not self.runtime.db  # states, token and events: one file
            or not self.agg.merges_in_database
        ):
            return None
        # A write now: only when one is due, or for a long range (a catch-up writes once per
        # range anyway). A trickle at the head stays held and conflated (persist_every).
        since = self.flushed_at.get(seg, st.persisted_at)
        if (
            pending.upto - pending.after < ranges.SPAN
            and time.monotonic() - since < self.persist_every
        ):
            return None
        if st.dirty and self.changed.get(seg) and (failed := self._flushed(st)) is not None:
            return failed
        with self.holding:
            if self.holder.get(seg) == (st, st.segment):
                for held in (self.entries, self.marks, self.changed):
                    held.pop(seg, None)
                self.caches[seg] = StateCache()
        token = advanced(st.token, pending.upto)
        started = time.perf_counter()

        def store_token(conn: Any) -> None:
            self.tokens.store(self.name, seg, token, self.owner, conn=conn)

        try:
            with self.committing(st, pending.upto):
                events = pushdown.merge_in_place(self.name, pending, store_token)
        except ClaimLostError:
            self.lost(st)
            self._let_go(st)
            return Outcome.LOST
        except Exception as exc:  # noqa: BLE001 - the database failed: retry from the token
            log.error("%s %s: writing states failed: %s", self.name, st.segment, describe(exc))
            self._let_go(st)
            return self.back_off(st, exc)
        if events is None:
            return None
        seconds = time.perf_counter() - started
        self.agg.pushed_down += events
        self.agg.placed += events
        self.observer.batch_handled(self.name, str(st.segment), events, seconds)
        st.token = token
        self.written(st, seconds)
        return Outcome.OK

    def _flushed(self, st: SegmentState) -> Outcome | None:
        """:meth:`flush` in the middle of a batch: None once written, else the batch's outcome
        (the claim lost, or the write failed: the segment backs off)."""
        self.flush(st)
        if st.lost or st.dirty:
            return Outcome.LOST if st.lost else Outcome.FAILED
        return None

    def _fold_range(self, st: SegmentState, entries: dict[str, Entry], folded: Folded) -> int:
        """Merge a range folded in SQL; or, when the dedupe fast rule does not hold for it (a
        state holds an own position at or above its first event), fold it again by rows."""
        seg = st.segment.id
        keys = [g[0] for g in folded]
        marks = self.load_keys(seg, entries, keys)
        pushdown = folded.reader.pushdown
        if (
            pushdown is not None
            and folded.exact
            and pushdown.merge(folded, entries, marks, self.source)
        ):
            self.dirtied(seg, keys)
            self.agg.pushed_down += folded.events
            return folded.events
        if pushdown is not None:  # reads take the row path until past the states' offsets
            pushdown.rows_until = max(pushdown.rows_until, marks.high.get(self.source, 0))
        handled = 0
        for events in folded.rows(st, self.agg.batch_size):
            self.fold_events(st, entries, events)
            handled += len(events)
        return handled

    def _fold(
        self,
        events: list[Event],
        keys: list[str],
        entries: dict[str, Entry],
        outputs: list[tuple[Stage, Coordinates, NewEvent, Event]],
        marks: Marks,
    ) -> None:
        """The user's folds over the events not folded in yet, in order."""
        accepted = dedupe(events, keys, entries, self.source, marks)
        for_type, stages = self.agg.folds.for_type, self.agg.stages
        kinds = set(types(events))
        if len(kinds) == 1 and not stages and len(only := for_type(kinds.pop())) == 1:
            # The usual aggregation: one fold of one type, no downstream stage.
            if len(accepted) != len(events):
                events = [events[i] for i in accepted]
                keys = [keys[i] for i in accepted]
            fold = only[0]
            values = [entries[k].value for k in keys]
            for value, event, key in zip(values, events, keys, strict=True):
                if (produced := fold(value, event)) is not None and produced is not value:
                    returned_value(self.name, key, event, fold, produced)
            return
        folds_of: dict[str, list[Fold]] = {}
        for i in accepted:
            event, key = events[i], keys[i]
            folds = folds_of.get(event.type)
            if folds is None:
                folds = folds_of[event.type] = for_type(event.type)
            value = entries[key].value
            made = 0  # outputs of this input so far: each fold's numbered after them
            for fold in folds:
                produced = fold(value, event)
                if produced is not None:
                    not_awaitable(produced, fold, event)
                    if not stages and produced is not value:
                        returned_value(self.name, key, event, fold, produced)
                if produced is not None and stages:
                    coords = coordinates(event, self.source)
                    outs = produced if isinstance(produced, list) else [produced]
                    for j, out in enumerate(outs, start=made):
                        check_output(self.name, key, event, j, out)
                        for stage in stages:
                            outputs.append(
                                (stage, (f"{self.name}:{key}", "", (*coords[2], j)), out, event)
                            )
                    made += len(outs)

    def idle(self, st: SegmentState, upto: int | dict[str, int]) -> None:
        super().idle(st, upto)
        if not self.rounds and self._due(st):
            self.flush(st)

    def end_round(self, states: list[SegmentState]) -> None:
        """Once one held segment is due a write, write every held segment changed since its
        last one, in one transaction: segments are written together, one commit for all
        (each commit waits for the disk: 4 segments written apart took 4 times the commits of
        one), and they stay due together."""
        if not any(self._due(st) for st in states if not st.lost):
            return
        group = [st for st in states if st.dirty and not st.lost]
        if len(group) == 1:
            self.flush(group[0])
            return
        started = time.perf_counter()
        try:
            self._write_all(group)
        except Exception:  # noqa: BLE001 - one at a time: each gets its own outcome
            for st in group:
                self.flush(st)
            return
        seconds = time.perf_counter() - started
        for st in group:
            self.written(st, seconds)

    def persist_idle(self, st: SegmentState) -> None:
        """Caught up: write only when ``persist_every`` has passed (the coordinator's rounds
        check it), so a trickle of events is still conflated."""
        if self._due(st):
            self.persist(st)

    def persist_due(self, states: list[SegmentState]) -> None:
        self.end_round(states)

    def _let_go(self, st: SegmentState) -> None:
        """Drop what is held for ``st``'s claim, unless a newer claim holds its segment now
        (a fold given up as stuck that returns late: what the new claim folded is not its to
        drop, or the new claim would write its token past states it no longer has)."""
        seg = st.segment.id
        with self.holding:
            if self.holder.get(seg) == (st, st.segment):
                self.discard(seg)

    def discard(self, seg: int) -> None:
        kept = (self.entries, self.marks, self.outputs, self.changed, self.holder, self.caches)
        for held in kept:
            held.pop(seg, None)

    def flush(self, st: SegmentState) -> None:
        """Write the segment's changed states and its token in one transaction (downstream
        first)."""
        if not st.dirty:
            return
        started = time.perf_counter()
        try:
            self._write_all([st])
        except ClaimLostError:
            self.lost(st)
            self._let_go(st)
            return
        except Exception as exc:  # noqa: BLE001 - the database failed: retry from the token
            log.error("%s %s: writing states failed: %s", self.name, st.segment, describe(exc))
            self._let_go(st)
            self.back_off(st, exc)
            return
        self.written(st, time.perf_counter() - started)

    def written(self, st: SegmentState, seconds: float) -> None:
        """The segment's states and token are stored: it is clean."""
        seg = st.segment.id
        self.observer.committed(self.name, str(st.segment), seconds)
        st.committed(st.token)
        self.flushed_at[seg] = st.persisted_at
        self.changed.pop(seg, None)
        self.outputs.pop(seg, None)
        cache = self.caches.get(seg)
        if cache is not None:
            cache.dirty = 0
            self._full(seg)  # bounded memory: past the budget, read back from the table

    def _write_all(self, group: list[SegmentState]) -> None:
        """The states each segment of ``group`` changed: downstream stages first, then
        published, then the segments' own with their tokens, in one transaction; each
        segment's commit span covers the whole write."""
        with ExitStack() as spans_open:
            for st in group:
                spans_open.enter_context(self.committing(st, st.token.position))
            rows = []
            for st in group:
                seg = st.segment.id
                entries = self.entries.get(seg, {})
                marks = self.marks.get(seg)
                offsets = marks.encode_offsets if marks is not None else None
                changed = self.changed.get(seg, ())
                self._flush_downstream(seg)
                self.publish(st, entries, changed, offsets)
                rows.append((st, entries, changed, self._measuring(seg, offsets)))
            with self.runtime.db.transaction() as conn:
                for st, entries, changed, measured in rows:
                    self.table.save(conn, self.name, entries, changed, measured)
                    self.write_more(conn, st)
                    # Not commit_token: the commit span is this whole write, states and token.
                    self.tokens.store(self.name, st.segment.id, st.token, self.owner, conn=conn)

    def publish(
        self, st: SegmentState, entries: dict[str, Entry], changed: Any, offsets: Offsets | None
    ) -> None:
        """Publish what a write of ``st`` stores (its changed states here), acknowledged
        before it commits."""
        if self.agg.publish is not None:
            keys = sorted(k for k in changed if k in entries)
            with self.runtime.db.connection() as conn:  # what the last write stored
                before = self.table.load(conn, self.name, keys)
            publish_states(self.agg.publish, self.name, entries, keys, offsets, None, before)

    def write_more(self, conn: Any, st: SegmentState) -> None:
        """What else a write of ``st`` stores in its transaction, before its token (a
        windowed aggregation's windows and clock)."""

    def _measuring(
        self, seg: int, offsets: Callable[[list[str], list[Entry]], list[str]] | None
    ) -> Callable[[list[str], list[Entry]], list[str]]:
        """The offsets' encoder of a write (``offsets``, or the entries' own), which also
        counts each state written at the size of its texts (the values encoded once more, a
        chunk at a time: C speed, beside the rows' writes)."""
        cache = self.caches.get(seg)

        def encode_offsets(keys: list[str], picked: list[Entry]) -> list[str]:
            if offsets is not None:
                texts = offsets(keys, picked)
            else:
                texts = encode_all([e.offsets for e in picked])
            if cache is not None:
                values = map(len, encode_all([e.value for e in picked]))
                cache.add(keys, map(operator.add, values, map(len, texts)))
            return texts

        return encode_offsets

    def commit_span(self, st: SegmentState, position: int) -> Span | None:
        """The span of a state write: in the batch's span when one runs, else on its own (a
        write when caught up, or when the segment is let go); None when tracing is off."""
        traced = spans.current()
        if traced is not None:
            return traced.commit(position)
        tracer = spans.tracer()
        if tracer is None:
            return None
        base = spans.base_attributes(self.name, st.segment, self.agg.guarantee.value,
                                     self.agg.version)  # fmt: skip
        return spans.commit(tracer, base, position)

    def _flush_downstream(self, seg: int) -> None:
        """Apply buffered outputs to the downstream stages' rows, read under a row lock, so
        upstream segments in other processes can feed the same downstream key."""
        pending = self.outputs.get(seg)
        if not pending:
            return
        db = self.runtime.db
        with db.transaction() as conn:
            for stage, keyed in by_stage(pending):
                keys = sorted({k for k, *_ in keyed})
                entries = self.table.lock(conn, stage.name, keys, stage.initial)
                newest = fold_downstream(stage, keyed, entries)
                if stage.publish is not None and newest:  # acknowledged before this commits
                    publish_states(stage.publish, stage.name, entries, newest, None, newest)
                self.table.save(conn, stage.name, entries)
        self.outputs.pop(seg, None)
