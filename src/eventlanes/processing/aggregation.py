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

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..db import Database
from ..errors import ClaimLostError, InvalidInputError
from ..events import Event, NewEvent
from ..names import validate_processor_name
from ..policies import SequencingPolicy
from .chains import CHAIN_KEY, Coordinates, coordinates, is_newer, record
from .handlers import FunctionsByType
from .processor import Processor
from .worker import Outcome, SegmentState, SegmentWorker, advanced, describe

if TYPE_CHECKING:
    from ..app import App

log = logging.getLogger("eventlanes.aggregation")
Fold = Callable[[Any, Event], Any]


class StateTable:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.table = t = db.table("aggregates")
        db.run_ddl(
            [
                f"""CREATE TABLE IF NOT EXISTS {t} (
                    aggregation TEXT NOT NULL,
                    key TEXT NOT NULL,
                    value TEXT NOT NULL,
                    offsets TEXT NOT NULL,
                    dropped BIGINT NOT NULL DEFAULT 0,
                    updated_at BIGINT NOT NULL,
                    PRIMARY KEY (aggregation, key))"""
            ]
        )
        q = db.sql
        self._upsert = q(
            f"""INSERT INTO {t} (aggregation, key, value, offsets, dropped, updated_at)
                VALUES (?, ?, ?, ?, ?, {db.now_ms})
                ON CONFLICT (aggregation, key) DO UPDATE SET value = excluded.value,
                    offsets = excluded.offsets, dropped = excluded.dropped,
                    updated_at = excluded.updated_at"""
        )

    def load(self, conn: Any, name: str, keys: list[str], lock: bool = False) -> dict[str, Any]:
        found: dict[str, Any] = {}
        suffix = self.db.for_update if lock else ""
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            marks = ", ".join(self.db.param for _ in chunk)
            rows = conn.execute(
                self.db.sql(
                    f"SELECT key, value, offsets, dropped FROM {self.table} "
                    f"WHERE aggregation = ? AND key IN ({marks}){suffix}"
                ),
                (name, *chunk),
            ).fetchall()
            for key, value, offsets, dropped in rows:
                found[key] = Entry(json.loads(value), json.loads(offsets), dropped)
        return found

    def save(self, conn: Any, name: str, entries: dict[str, Entry]) -> None:
        dumps = json.dumps
        rows = [(k, dumps(e.value), dumps(e.offsets), e.dropped) for k, e in entries.items()]
        self.save_encoded(conn, name, rows)

    def save_encoded(self, conn: Any, name: str, rows: list[tuple[str, str, str, int]]) -> None:
        """Upsert (key, value JSON, offsets JSON, dropped) rows encoded elsewhere (Spark)."""
        params = [(name, *row) for row in rows]
        cur = conn.cursor()
        try:
            cur.executemany(self._upsert, params)
        finally:
            cur.close()

    def get(self, name: str, key: str) -> Any:
        with self.db.connection() as conn:
            entry = self.load(conn, name, [key]).get(key)
        return None if entry is None else entry.value

    def dropped(self, name: str) -> int:
        sql = self.db.sql(
            f"SELECT coalesce(sum(dropped), 0) FROM {self.table} WHERE aggregation = ?"
        )
        return int(self.db.query(sql, (name,))[0][0])


@dataclass
class Entry:
    value: Any
    offsets: dict[str, list[Any]] = field(default_factory=dict)
    dropped: int = 0


class _FieldKey:
    """``key="robot"``: the property as JSON text renders it (strings as they are), which is
    what Spark's ``get_json_object`` returns, so both engines agree on every key."""

    def __init__(self, field: str) -> None:
        self.field = field

    def __call__(self, event: Event) -> str:
        value = event.data[self.field]
        return value if isinstance(value, str) else json.dumps(value)


def _check_callables(name: str, key: Any, initial: Any) -> None:
    if not callable(key):
        raise InvalidInputError(f"aggregation {name!r}: key must be a function of the event")
    if not callable(initial):
        raise InvalidInputError(f"aggregation {name!r}: initial must be a function (fresh state)")


class Stage:
    """A downstream aggregation, fed by the outputs of an upstream aggregation's folds."""

    def __init__(self, upstream: Aggregation, name: str, key: Any, initial: Any) -> None:
        validate_processor_name(name)
        _check_callables(name, key, initial)
        self.upstream = upstream
        self.name = name
        self.key = key
        self.initial = initial
        self.folds = FunctionsByType(name)
        self.on = self.folds.on

    def get(self, key: str) -> Any:
        return self.upstream.states.get(self.name, key)


class Aggregation(Processor):
    """``app.aggregation(name, key=..., initial=..., persist_every=1.0)``; ``@agg.on(type)``
    registers ``fold(state, event)``, which updates ``state`` in place (or returns outputs for
    a downstream stage)."""

    def __init__(
        self,
        app: App,
        name: str,
        *,
        key: Callable[[Event], Any] | str,
        initial: Callable[[], Any],
        persist_every: float = 1.0,
        **options: Any,
    ) -> None:
        # key="robot" (a data property) is the same as key=lambda e: e.data["robot"], and lets
        # Spark extract it natively instead of calling Python for every event.
        self.key_field = key if isinstance(key, str) and key else None
        if self.key_field is not None:
            key = _FieldKey(self.key_field)
        _check_callables(name, key, initial)
        self.folds = FunctionsByType(name)
        self.key = key
        folds = self.folds
        # Route by the aggregation key so each key's state lives in exactly one segment; events
        # no fold handles have no key (and are skipped).
        policy = SequencingPolicy(
            lambda e: key(e) if folds.handles(e.type) else None, f"aggregation({name})"
        )
        super().__init__(app, name, policy=policy, **options)
        if not isinstance(persist_every, int | float) or persist_every < 0:
            raise InvalidInputError(f"aggregation {name!r}: persist_every must be >= 0 seconds")
        self.persist_every = float(persist_every)
        self.initial_state = initial
        self.stages: list[Stage] = []

    def on(self, *types: str) -> Callable[[Fold], Fold]:  # type: ignore[override]
        return self.folds.on(*types)

    def on_any(self, fold: Fold) -> Fold:  # type: ignore[override]
        self.folds.any.append(fold)
        return fold

    def downstream(self, name: str, key: Callable[[Any], Any], initial: Callable[[], Any]) -> Stage:
        """A stage fed with this aggregation's fold outputs (``NewEvent``s)."""
        stage = Stage(self, name, key, initial)
        self.stages.append(stage)
        return stage

    @property
    def states(self) -> StateTable:
        return self.app.aggregate_states

    def get(self, key: str) -> Any:
        """The persisted state of ``key`` (None if nothing was folded for it yet)."""
        return self.states.get(self.name, key)

    def dropped(self) -> int:
        """Inputs dropped because they were already folded in (duplicates)."""
        return self.states.dropped(self.name)

    def make_worker(self, runner: Any) -> AggregationWorker:
        return AggregationWorker(runner, self)


class AggregationWorker(SegmentWorker):
    def __init__(self, runner: Any, agg: Aggregation) -> None:
        super().__init__(runner)
        self.agg = agg
        self.table = agg.states
        self.source = runner.store.events_table
        # Per segment id: states touched since the last write and when it was. The segment's
        # in-memory token runs ahead of the stored one until the next write (states + token).
        self.entries: dict[int, dict[str, Entry]] = {}
        self.flushed_at: dict[int, float] = {}
        self.outputs: dict[int, list[tuple[Stage, Coordinates, NewEvent, Event]]] = {}

    def process(self, st: SegmentState, events: list[Event], upto: int | dict[str, int]) -> Outcome:
        seg = st.segment.id
        entries = self.entries.setdefault(seg, {})
        outputs = self.outputs.setdefault(seg, [])
        self.flushed_at.setdefault(seg, time.monotonic())
        started = time.perf_counter()  # observe
        try:
            keyed = [(e, str(self.agg.key(e))) for e in events if self.agg.folds.handles(e.type)]
            missing = sorted({k for _, k in keyed} - entries.keys())
            if missing:
                with self.runner.db.connection() as conn:
                    entries.update(self.table.load(conn, self.name, missing))
            for event, key in keyed:
                entry = entries.get(key)
                if entry is None:
                    entry = entries[key] = Entry(self.agg.initial_state())
                coords = coordinates(event, self.source)
                if not is_newer(entry.offsets, coords):
                    entry.dropped += 1
                    continue
                for fold in self.agg.folds.for_type(event.type):
                    produced = fold(entry.value, event)
                    if produced is not None and self.agg.stages:
                        outs = produced if isinstance(produced, list) else [produced]
                        for i, out in enumerate(outs):
                            for stage in self.agg.stages:
                                outputs.append(
                                    (stage, (f"{self.name}:{key}", "", (*coords[2], i)), out, event)
                                )
                record(entry.offsets, coords)
        except Exception as exc:  # noqa: BLE001 - a fold may have half-updated a state
            self._discard(seg)
            return self._back_off(st, exc)
        st.token = advanced(st.token, upto)
        st.dirty = True
        self.runner.observer.batch_handled(
            self.name, str(st.segment), len(events), time.perf_counter() - started
        )  # observe
        if time.monotonic() - self.flushed_at[seg] >= self.agg.persist_every:
            self.flush(st)
            if st.lost:
                return Outcome.LOST
        return Outcome.OK

    def idle(self, st: SegmentState, upto: int | dict[str, int]) -> None:
        super().idle(st, upto)
        if time.monotonic() - self.flushed_at.get(st.segment.id, 0) >= self.agg.persist_every:
            self.flush(st)

    def _discard(self, seg: int) -> None:
        for held in (self.entries, self.outputs):
            held.pop(seg, None)

    def flush(self, st: SegmentState) -> None:
        """Write the segment's states and its token in one transaction (downstream first)."""
        seg = st.segment.id
        if not st.dirty:
            return
        db = self.runner.db
        started = time.perf_counter()  # observe
        try:
            self._flush_downstream(seg)
            with db.transaction() as conn:
                self.table.save(conn, self.name, self.entries.get(seg, {}))
                self.runner.tokens.store(self.name, seg, st.token, self.runner.owner, conn=conn)
        except ClaimLostError:
            st.lost = True
            self._discard(seg)
            return
        except Exception as exc:  # noqa: BLE001 - the database failed: retry from the token
            log.error("%s %s: writing states failed: %s", self.name, st.segment, describe(exc))
            self._discard(seg)
            self._back_off(st, exc)
            return
        st.dirty = False
        self.runner.observer.committed(
            self.name, str(st.segment), time.perf_counter() - started
        )  # observe
        st.persisted_at = self.flushed_at[seg] = time.monotonic()
        self._discard(seg)  # memory is bounded by what arrives between two writes

    def _flush_downstream(self, seg: int) -> None:
        """Apply buffered outputs to the downstream stages' rows, read under a row lock, so
        upstream segments in other processes can feed the same downstream key."""
        pending = self.outputs.get(seg)
        if not pending:
            return
        db = self.runner.db
        with db.transaction() as conn:
            by_stage: dict[str, list[tuple[Stage, Coordinates, NewEvent, Event]]] = {}
            for item in pending:
                by_stage.setdefault(item[0].name, []).append(item)
            for name, items in by_stage.items():
                stage = items[0][0]
                keyed = [(str(stage.key(out)), coords, out, src) for _, coords, out, src in items]
                entries = self.table.load(conn, name, sorted({k for k, *_ in keyed}), lock=True)
                for key, coords, out, src in keyed:
                    entry = entries.get(key)
                    if entry is None:
                        entry = entries[key] = Entry(stage.initial())
                    if not is_newer(entry.offsets, coords):
                        entry.dropped += 1
                        continue
                    event = _as_event(out, src, coords)
                    for fold in stage.folds.for_type(event.type):
                        fold(entry.value, event)
                    record(entry.offsets, coords)
                self.table.save(conn, name, entries)
        self.outputs.pop(seg, None)


def _as_event(out: Any, source: Event, coords: Coordinates) -> Event:
    """A fold output as an event for the downstream folds (position: its input's)."""
    if not isinstance(out, NewEvent):
        raise InvalidInputError(f"fold outputs must be el.NewEvent, got {type(out).__name__}")
    metadata = {**out.metadata, CHAIN_KEY: [{"source": coords[0], "partition": coords[1],
                                             "offset": coords[2][0]}]}  # fmt: skip
    return Event(source.position, coords[0], 0, out.type, out.data, metadata,
                 source._recorded_at, 0, coords[0])  # fmt: skip
