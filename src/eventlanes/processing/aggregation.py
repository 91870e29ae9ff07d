"""Exactly-once aggregations of non-idempotent folds (sums, counters).

State lives in memory and is written every ``persist_every`` seconds (conflated per key), in one
transaction with the segment's token, so the token never passes an event whose effect is not
stored. Each state row also keeps, per source, the newest source coordinates folded in
(``chains.py``); an input that is not newer is dropped and counted: duplicates re-appended by a
republisher that crashed before committing its token are never counted twice.

A fold may return outputs (a flat map) for a downstream stage (``agg.downstream(...)``). Outputs
of one input are applied together; the downstream stage is persisted first, then this stage and
its token, so a crash in between only re-emits outputs that the downstream stage drops.

Table ``{prefix}aggregates``: (aggregation, key) primary key, ``value`` (JSON), ``offsets``
(JSON: source -> [partition, path]), ``dropped`` (inputs dropped as already folded),
``updated_at`` (epoch ms).
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..callables import check, name_of
from ..errors import ClaimLostError, InvalidInputError
from ..events import Event, NewEvent, datas, encode_object, types
from ..names import validate_base_name, validate_processor_name, versioned_name
from ..policies import SequencingPolicy, key_text
from ..segments import Segment
from ..tracing import spans
from .chains import (
    CHAIN_KEY,
    Coordinates,
    Marks,
    coordinates,
    coordinates_chain,
    dedupe,
    is_newer,
    record,
    state_chain,
)
from .declarative import Declaration, Op
from .dispatch import describe
from .handlers import FunctionsByType
from .processor import Processor
from .pushdown import Folded
from .state import Outcome, SegmentState
from .states import Entry, StateTable
from .worker import SegmentWorker

if TYPE_CHECKING:
    from .runtime import Runtime

__all__ = ["Aggregation", "AggregationWorker", "Entry", "Stage", "StateTable"]

log = logging.getLogger("eventlanes.aggregation")
Fold = Callable[[Any, Event], Any]


class _FieldKey:
    """``key="robot"``: the property as JSON text renders it (strings as they are), which is
    what Spark's ``get_json_object`` returns, so both engines agree on every key."""

    def __init__(self, field: str) -> None:
        self.field = field

    def __call__(self, event: Event) -> str:
        value = event.data[self.field]
        return value if isinstance(value, str) else json.dumps(value)


def _check_callables(name: str, key: Any, initial: Any) -> None:
    what = f"aggregation {name!r}"
    check(key, f"{what}: key", ("event",), why_sync="the key routes the event before it is read")
    check(initial, f"{what}: initial", (), why_sync="it makes a fresh state when one is needed")


#: states a fold cannot change in place: ``state += 1`` rebinds the fold's own name only
_IMMUTABLE = (int, float, complex, str, bytes, bool, tuple, frozenset, type(None))
_IN_PLACE = 'a fold updates its state in place (state["n"] += 1) and returns nothing'


def check_fresh_state(kind: str, name: str, initial: Callable[[], Any]) -> None:
    """Refuse an ``initial()`` whose states no fold can change (an int, a string, a tuple,
    None...): folds update the state in place, so such a state would stay as it started,
    silently. Only where no downstream stage takes the folds' outputs (a stage of its own
    is then the point: its upstream state may be anything)."""
    try:
        value = initial()
    except Exception:  # noqa: BLE001 - fails where the first state is made, with its error
        return
    if isinstance(value, _IMMUTABLE):
        raise InvalidInputError(
            f"{kind} {name!r}: initial() gives {type(value).__name__} {value!r}, which no fold "
            f"can change ({_IN_PLACE}; a value it returns is not the new state): start from "
            'a dict or a list, e.g. initial=lambda: {"n": 0}'
        )


def returned_value(name: str, key: str, event: Event, fold: Any, produced: Any) -> None:
    """A fold returned a value where no downstream stage takes outputs: refused, since it
    would be dropped (a fold returning the new state, ``return state + 1``, would otherwise
    leave the state as it was, silently). Returning the state itself is allowed."""
    _not_awaitable(produced, fold, event)
    shown = repr(produced)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise InvalidInputError(
        f"aggregation {name!r}, key {key!r}: fold {name_of(fold)} returned "
        f"{type(produced).__name__} {shown} for event {event.position} ({event.type}), and "
        f"no downstream stage takes a fold's outputs: {_IN_PLACE}, it does not return the "
        "new state"
    )


class Stage:
    """A downstream aggregation, fed by the outputs of an upstream aggregation's folds."""

    def __init__(
        self, upstream: Aggregation, name: str, key: Any, initial: Any, publish: Any = None
    ) -> None:
        validate_processor_name(name)
        _check_callables(name, key, initial)
        check_fresh_state("stage", name, initial)  # a stage has no stages of its own
        self.publish = _sink(name, publish, upstream.version)
        self.upstream = upstream
        self.name = name
        self.key = key
        self.initial = initial
        self.folds = FunctionsByType(f"stage {name!r}")
        self.on = self.folds.on

    def get(self, key: str) -> Any:
        """The stage's state of ``key`` as last written (None when there is none)."""
        return self.upstream.states.get(self.name, key)


class Aggregation(Processor):
    """``app.aggregation(name, key=..., initial=..., persist_every=1.0)``; ``@agg.on(type)``
    registers ``fold(state, event)``, which updates ``state`` in place (or returns outputs for
    a downstream stage).

    ``batch_size``: the events read at a time by rows (states are written every
    ``persist_every`` seconds whatever it is). A declarative aggregation (``fields=``) over a
    SQLite store is folded inside SQLite over larger ranges when that is exact
    (:mod:`.pushdown`); ``pushdown=False`` always folds by rows."""

    _kind = "aggregation"
    #: a new version may fold by another key (routing otherwise): its replay flags (shown by
    #: status; folds do not depend on them) take only what every part of the old one passed
    _routes_as_versions = False

    def __init__(
        self,
        runtime: Runtime,
        name: str,
        *,
        key: Callable[[Event], Any] | str,
        initial: Callable[[], Any] | None = None,
        persist_every: float = 1.0,
        fields: dict[str, Op] | None = None,
        on: str | list[str] | None = None,
        pushdown: bool = True,
        publish: Any = None,
        **options: Any,
    ) -> None:
        # key="robot" (a data property) is the same as key=lambda e: e.data["robot"], and lets
        # Spark extract it natively instead of calling Python for every event.
        self.key_field = key if isinstance(key, str) and key else None
        key_fn: Callable[[Event], Any] = _FieldKey(key) if isinstance(key, str) and key else key  # type: ignore[assignment]
        self.folds = FunctionsByType(f"aggregation {name!r}")
        #: fields=...: a declarative aggregation (declarative.py), folded without Python per event
        self.declaration: Declaration | None = None
        if fields is not None or on is not None:
            if initial is not None:
                raise InvalidInputError(
                    f"aggregation {name!r}: declared fields start from their own initial values "
                    "(count and sum 0, the others null): drop initial="
                )
            decl = self.declaration = Declaration.build(name, key, on, fields)
            key_fn, initial = decl.key_of, decl.initial
            for t in sorted(decl.types):
                self.folds.by_type[t] = [decl.fold]  # the per-event path (continuous mode)
        _check_callables(name, key_fn, initial)
        self.key: Callable[[Event], Any] = key_fn
        folds = self.folds

        # Route by the aggregation key so each key's state lives in exactly one segment; events
        # no fold handles have no key (and are skipped).
        def route(event: Event) -> Any:
            if not folds.handles(event.type):
                return None
            try:
                return key_fn(event)
            except Exception:  # noqa: BLE001 - the segment's worker fails on it, clearly
                return None

        policy = SequencingPolicy(route, f"aggregation({name})")
        if "guarantee" in options:
            raise InvalidInputError(f"aggregation {name!r}: the guarantee is 'aggregation'")
        super().__init__(runtime, name, policy=policy, guarantee="aggregation", **options)
        if not isinstance(persist_every, int | float) or persist_every < 0:
            raise InvalidInputError(f"aggregation {name!r}: persist_every must be >= 0 seconds")
        self.persist_every = float(persist_every)
        self.initial_state: Callable[[], Any] = initial  # type: ignore[assignment]
        self.stages: list[Stage] = []
        if self.declaration is not None:
            self.refuse_upcast(self.declaration.types)
        if not isinstance(pushdown, bool):
            raise InvalidInputError(f"aggregation {name!r}: pushdown must be True or False")
        #: fold declared fields inside SQLite where exact (pushdown.py)
        self.pushdown = pushdown
        #: a KafkaSink: each state written is published first (kafka/sink.py)
        self.publish = _sink(name, publish, self.version)
        #: events this process folded inside SQLite (for tests and tuning)
        self.pushed_down = 0

    def on(self, *types: str) -> Callable[[Fold], Fold]:
        self._python_only("on()")
        register = self.folds.on(*types)
        self.refuse_upcast(types)
        return register

    def on_any(self, fold: Fold) -> Fold:
        self._python_only("on_any()")
        return self.folds.add_any(fold)

    def _python_only(self, what: str) -> None:
        if self.declaration is not None:
            raise InvalidInputError(
                f"aggregation {self.name!r} is declarative (fields=...): {what} needs a Python "
                "fold; define another aggregation for it"
            )

    def downstream(
        self,
        name: str,
        key: Callable[[Any], Any],
        initial: Callable[[], Any],
        publish: Any = None,
    ) -> Stage:
        """A stage fed with this aggregation's fold outputs (``NewEvent``s); ``publish``: a
        KafkaSink its states are published to before they are written."""
        self._python_only("downstream()")
        # A version's stages keep states of their own, as it does (``stage@vN``).
        name = versioned_name(validate_base_name(name), self.version)
        stage = Stage(self, name, key, initial, publish)
        self.stages.append(stage)
        return stage

    def handled_types(self) -> frozenset[str] | None:
        return self.folds.types()

    @property
    def states(self) -> StateTable:
        """The table the states are written to."""
        return self.runtime.states

    def get(self, key: str) -> Any:
        """The persisted state of ``key`` (None if nothing was folded for it yet)."""
        return self.states.get(self.name, key)

    def dropped(self) -> int:
        """Inputs dropped because they were already folded in (duplicates)."""
        return self.states.dropped(self.name)


def _sink(name: str, publish: Any, version: int) -> Any:
    """``publish=``: anything with ``publish(records)`` that returns once every record was
    acknowledged (an ``el.KafkaSink``). Not on a version from 2 on: its warm-up folds all of
    history again, and it runs beside the version before it."""
    if publish is not None and not callable(getattr(publish, "publish", None)):
        raise InvalidInputError(f"aggregation {name!r}: publish= takes an el.KafkaSink")
    if publish is not None and version != 1:
        raise InvalidInputError(
            f"aggregation {name!r}: publish= on version {version} would publish the states of "
            "its warm-up (all of history folded again) and then publish beside the version "
            "before it; publish from version 1 only, or from an aggregation of another name"
        )
    return publish


Offsets = Callable[[list[str], list[Entry]], list[str]]


def _publish_states(
    sink: Any,
    name: str,
    entries: dict[str, Entry],
    keys: Iterable[str],
    offsets: Offsets | None,
    newest: dict[str, Coordinates] | None = None,
) -> None:
    """Publish the states of ``keys`` (acknowledged before the caller commits them), each with
    the coordinates of the newest input folded into it (``newest``, else its offsets)."""
    keys = sorted(k for k in keys if k in entries)
    picked = [entries[k] for k in keys]
    if offsets is not None:
        texts = offsets(keys, picked)
    else:
        texts = [json.dumps(e.offsets) for e in picked]
    records = []
    for key, entry, text in zip(keys, picked, texts, strict=True):
        coords = (newest or {}).get(key)
        chain = (coordinates_chain(name, *coords) if coords is not None
                 else state_chain(name, json.loads(text)))  # fmt: skip
        records.append((key, entry.value, chain,
                        [("type", b"AggregateState"), ("aggregation", name.encode())]))  # fmt: skip
    sink.publish(records)


#: states kept in memory after a write, per worker, so the next batches need not read them
#: back (memory stays bounded: past this many, they are dropped after the write)
CACHE_LIMIT = 200_000


def _of_types(events: list[Event], wanted: frozenset[str]) -> list[Event]:
    """The events of the ``wanted`` types (all of them, usually: reads filter by type)."""
    if len(wanted) == 1:
        (only,) = wanted
        if types(events).count(only) == len(events):
            return events
    return [e for e in events if e.type in wanted]


def _keyless(key: Any, event: Event, name: str) -> str:
    if key is None:  # never folded into a state named "None"
        raise InvalidInputError(
            f"event {event.position} ({event.type}): the aggregation key is None"
        )
    return key_text(key, f"aggregation {name!r}", event)


class AggregationWorker(SegmentWorker):
    """Folds a segment's batches into states held in memory; writes the states changed since
    the last write, with the segment's token, every ``persist_every`` seconds.

    States stay in memory after a write (up to ``CACHE_LIMIT``) while the segment is held as it
    was: they equal the stored rows, since only the claim's holder writes them. A segment
    split, merged, released or lost starts from the table again."""

    def __init__(self, runtime: Runtime, agg: Aggregation, owner: str) -> None:
        super().__init__(runtime, agg, owner)
        self.agg = agg
        self.table = agg.states
        self.source = runtime.store.events_table
        # Per segment id: the states known (clean and dirty), the keys changed since the last
        # write, and for which held segment they are valid. The segment's in-memory token runs
        # ahead of the stored one until the next write (states + token).
        self.entries: dict[int, dict[str, Entry]] = {}
        self.marks: dict[int, Marks] = {}  # what dedupe knows of the entries' offsets
        self.changed: dict[int, set[str]] = {}
        self.holder: dict[int, tuple[SegmentState, Segment]] = {}
        self.flushed_at: dict[int, float] = {}
        self.outputs: dict[int, list[tuple[Stage, Coordinates, NewEvent, Event]]] = {}
        self.persist_every = agg.persist_every
        if not agg.stages:  # all stages are declared by now: the app starts
            check_fresh_state("aggregation", agg.name, agg.initial_state)
        decl = agg.declaration
        self.types = decl.types if decl is not None else None

    def traced_events(self, events: Any) -> tuple[list[Event], int, int | None, int | None]:
        """A range folded in SQLite has no events in Python to link: its count and range."""
        if isinstance(events, Folded):
            return [], events.events, events.after + 1, events.upto
        return events, len(events), None, None

    def trace_attributes(self, events: Any) -> dict[str, Any] | None:
        return {spans.PUSHDOWN: isinstance(events, Folded)}

    def _entries(self, st: SegmentState) -> dict[str, Entry]:
        seg = st.segment.id
        if self.holder.get(seg) != (st, st.segment):  # another claim, or split: from the table
            self._discard(seg)
            self.holder[seg] = (st, st.segment)
        return self.entries.setdefault(seg, {})

    def _keyed(self, events: list[Event]) -> tuple[list[Event], list[str], Any]:
        """The events folded, their keys (each computed once) and, for a declared aggregation,
        their decoded data."""
        decl = self.agg.declaration
        if decl is not None:
            mine = _of_types(events, decl.types)
            rows = datas(mine, keep=False)  # read by the declaration only: not kept
            return mine, decl.keys_of(mine, rows), rows
        handles, key = self.agg.folds.handles, self.agg.key
        handled = self.agg.folds.types()
        if handled is not None and not self.agg.folds.any:
            mine = _of_types(events, handled)
        else:
            mine = [e for e in events if handles(e.type)]
        field = self.agg.key_field
        if field is not None:  # key="k": from the data, decoded in one pass
            keys: list[Any] = [d.get(field) for d in datas(mine)]
            if list(map(type, keys)).count(str) == len(keys):
                return mine, keys, None
        keys = [k if (k := key(e)).__class__ is str else _keyless(k, e, self.name) for e in mine]
        return mine, keys, None

    def process(self, st: SegmentState, events: list[Any], upto: int | dict[str, int]) -> Outcome:
        """Fold ``events`` (or a range folded in SQL: :class:`~.pushdown.Folded`) and move
        the segment's token to ``upto`` in memory; states and token are written together
        every ``persist_every`` seconds."""
        seg = st.segment.id
        entries = self._entries(st)
        self.flushed_at.setdefault(seg, time.monotonic())
        started = time.perf_counter()
        try:
            if isinstance(events, Folded):
                handled = self._fold_range(st, entries, events)
            else:
                handled = len(events)
                self._fold_events(st, entries, events)
        except Exception as exc:  # noqa: BLE001 - a fold may have half-updated a state
            self._discard(seg)
            return self.back_off(st, exc)
        if st.lost:  # given up on (a fold ran past handler_timeout): nothing of it is written
            self._discard(seg)
            return Outcome.LOST
        seconds = time.perf_counter() - started
        self.observer.batch_handled(self.name, str(st.segment), handled, seconds)
        st.moved(upto)
        st.dirty = True  # states changed: written with the token even if it did not move
        if time.monotonic() - self.flushed_at[seg] >= self.agg.persist_every:
            self.flush(st)
            if st.lost:
                return Outcome.LOST
        return Outcome.OK

    def _load(self, seg: int, entries: dict[str, Entry], keys: Iterable[str]) -> Marks:
        """Every key of ``keys`` in ``entries`` (read from the table, or fresh); the segment's
        marks, raised to cover the offsets read."""
        marks = self.marks.setdefault(seg, Marks())
        missing = sorted(set(keys) - entries.keys())
        if missing:
            with self.runtime.db.connection() as conn:
                loaded = self.table.load(conn, self.name, missing)
            marks.saw(loaded.values())
            entries.update(loaded)
            initial = self.agg.initial_state
            for key in missing:
                if key not in entries:
                    entries[key] = Entry(initial())
        return marks

    def _fold_events(
        self, st: SegmentState, entries: dict[str, Entry], events: list[Event]
    ) -> None:
        seg = st.segment.id
        mine, keys, rows = self._keyed(events)
        distinct = set(keys)
        marks = self._load(seg, entries, distinct)
        self.changed.setdefault(seg, set()).update(distinct)
        if mine:  # a batch's folds are bounded by handler_timeout (watched per batch: cheap)
            st.watch(f"the folds of events {mine[0].position} to {mine[-1].position}")
        try:
            if self.agg.declaration is not None:
                self.agg.declaration.fold_batch(mine, keys, entries, self.source, marks, rows)
            else:
                self._fold(mine, keys, entries, self.outputs.setdefault(seg, []), marks)
        finally:
            st.idle_now()

    def _fold_range(self, st: SegmentState, entries: dict[str, Entry], folded: Folded) -> int:
        """Merge a range folded in SQL; or, when the dedupe fast rule does not hold for it (a
        state holds an own position at or above its first event), fold it again by rows."""
        seg = st.segment.id
        keys = [g[0] for g in folded]
        marks = self._load(seg, entries, keys)
        pushdown = folded.reader.pushdown
        if pushdown is not None and pushdown.merge(folded, entries, marks, self.source):
            self.changed.setdefault(seg, set()).update(keys)
            self.agg.pushed_down += folded.events
            return folded.events
        if pushdown is not None:  # reads take the row path until past the states' offsets
            pushdown.rows_until = max(pushdown.rows_until, marks.high.get(self.source, 0))
        handled = 0
        for events in folded.rows(st, self.agg.batch_size):
            self._fold_events(st, entries, events)
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
            for fold in folds:
                produced = fold(value, event)
                if produced is not None:
                    _not_awaitable(produced, fold, event)
                    if not stages and produced is not value:
                        returned_value(self.name, key, event, fold, produced)
                if produced is not None and stages:
                    coords = coordinates(event, self.source)
                    outs = produced if isinstance(produced, list) else [produced]
                    for j, out in enumerate(outs):
                        check_output(self.name, key, event, j, out)
                        for stage in stages:
                            outputs.append(
                                (stage, (f"{self.name}:{key}", "", (*coords[2], j)), out, event)
                            )

    def idle(self, st: SegmentState, upto: int | dict[str, int]) -> None:
        super().idle(st, upto)
        if time.monotonic() - self.flushed_at.get(st.segment.id, 0) >= self.agg.persist_every:
            self.flush(st)

    def persist_idle(self, st: SegmentState) -> None:
        """Caught up: write only when ``persist_every`` has passed (the coordinator's rounds
        check it), so a trickle of events is still conflated."""
        if st.persist_due(self.persist_every):
            self.persist(st)

    def _discard(self, seg: int) -> None:
        for held in (self.entries, self.marks, self.outputs, self.changed, self.holder):
            held.pop(seg, None)

    def flush(self, st: SegmentState) -> None:
        """Write the segment's changed states and its token in one transaction (downstream
        first)."""
        seg = st.segment.id
        if not st.dirty:
            return
        db = self.runtime.db
        started = time.perf_counter()
        entries = self.entries.get(seg, {})
        marks = self.marks.get(seg)
        commit = self._commit_span(st)
        try:
            self._flush_downstream(seg)
            if self.agg.publish is not None:
                _publish_states(self.agg.publish, self.name, entries, self.changed.get(seg, ()),
                                marks.encode_offsets if marks is not None else None)  # fmt: skip
            with db.transaction() as conn:
                self.table.save(conn, self.name, entries, self.changed.get(seg, ()),
                                marks.encode_offsets if marks is not None else None)  # fmt: skip
                self.tokens.store(self.name, seg, st.token, self.owner, conn=conn)
        except ClaimLostError as exc:
            spans.ended(commit, exc)
            st.mark_lost()
            self._discard(seg)
            return
        except Exception as exc:  # noqa: BLE001 - the database failed: retry from the token
            spans.ended(commit, exc)
            log.error("%s %s: writing states failed: %s", self.name, st.segment, describe(exc))
            self._discard(seg)
            self.back_off(st, exc)
            return
        except BaseException as exc:
            spans.ended(commit, exc)
            raise
        spans.ended(commit)
        self.observer.committed(self.name, str(st.segment), time.perf_counter() - started)
        st.committed(st.token)
        self.flushed_at[seg] = st.persisted_at
        self.changed.pop(seg, None)
        self.outputs.pop(seg, None)
        if sum(len(e) for e in list(self.entries.values())) > CACHE_LIMIT:
            self.entries.pop(seg, None)  # bounded memory: read back from the table
            self.marks.pop(seg, None)

    def _commit_span(self, st: SegmentState) -> Any:
        """The span of a state write: in the batch's span when one runs, else on its own (a
        write when caught up, or when the segment is let go); None when tracing is off."""
        traced = spans.current()
        if traced is not None:
            return traced.commit(st.token.position)
        tracer = spans.tracer()
        if tracer is None:
            return None
        base = spans.base_attributes(self.name, st.segment, self.agg.guarantee.value,
                                     getattr(self.agg, "version", None))  # fmt: skip
        return spans.commit(tracer, base, st.token.position)

    def _flush_downstream(self, seg: int) -> None:
        """Apply buffered outputs to the downstream stages' rows, read under a row lock, so
        upstream segments in other processes can feed the same downstream key."""
        pending = self.outputs.get(seg)
        if not pending:
            return
        db = self.runtime.db
        with db.transaction() as conn:
            by_stage: dict[str, list[tuple[Stage, Coordinates, NewEvent, Event]]] = {}
            for item in pending:
                by_stage.setdefault(item[0].name, []).append(item)
            for name, items in by_stage.items():
                stage = items[0][0]
                keyed = [
                    (key_text(stage.key(out), f"stage {name!r}", src), coords, out, src)
                    for _, coords, out, src in items
                ]
                keys = sorted({k for k, *_ in keyed})
                entries = self.table.lock(conn, name, keys, stage.initial)
                newest: dict[str, Coordinates] = {}
                for key, coords, out, src in keyed:
                    entry = entries.get(key)
                    if entry is None:
                        entry = entries[key] = Entry(stage.initial())
                    if not is_newer(entry.offsets, coords):
                        entry.dropped += 1
                        continue
                    event = _as_event(out, src, coords)
                    value = entry.value
                    for fold in stage.folds.for_type(event.type):
                        if (produced := fold(value, event)) is not None and produced is not value:
                            returned_value(name, key, event, fold, produced)  # no stages here
                    record(entry.offsets, coords)
                    newest[key] = coords
                if stage.publish is not None and newest:  # acknowledged before this commits
                    _publish_states(stage.publish, name, entries, newest, None, newest)
                self.table.save(conn, name, entries)
        self.outputs.pop(seg, None)


def _not_awaitable(produced: Any, fold: Any, event: Event) -> None:
    """A fold's result is its outputs: a coroutine (a plain def returning one) never ran."""
    if hasattr(produced, "__await__") or inspect.isgenerator(produced):
        raise InvalidInputError(
            f"event {event.position} ({event.type}): fold {name_of(fold)} returned "
            f"{type(produced).__name__}, whose body never runs: folds update the state in place"
        )


def check_output(name: str, key: str, event: Event, index: int, out: Any) -> None:
    """A fold's output must be an ``el.NewEvent`` whose data and metadata read back equal from
    JSON: the Spark engine passes outputs on as JSON, the local one in memory, and both must
    fold the same values (an output ``{1: "a"}`` would reach Spark's stages as ``{"1": "a"}``)."""
    where = f"aggregation {name!r}, key {key!r}: output #{index} of event {event.position}"
    if not isinstance(out, NewEvent):
        raise InvalidInputError(f"{where} is a {type(out).__name__}, not an el.NewEvent")
    encode_object(out.data, f"{where} ({out.type}) data")
    encode_object(out.metadata, f"{where} ({out.type}) metadata")


def _as_event(out: Any, source: Event, coords: Coordinates) -> Event:
    """A fold output as an event for the downstream folds (position: its input's)."""
    if not isinstance(out, NewEvent):
        raise InvalidInputError(f"fold outputs must be el.NewEvent, got {type(out).__name__}")
    metadata = {**out.metadata, CHAIN_KEY: [{"source": coords[0], "partition": coords[1],
                                             "offset": coords[2][0]}]}  # fmt: skip
    return Event(source.position, coords[0], 0, out.type, out.data, metadata,
                 source._recorded_at, 0, coords[0])  # fmt: skip
