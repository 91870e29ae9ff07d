"""Aggregation folds on Arrow batches: the same key, dedupe and fold code as the local engine.

Spark gives each task an iterator of Arrow record batches; rows are turned into events a batch
at a time (columns to lists, no per-row Spark call), folded in key order, and one row per key is
emitted. Memory per task is one key's state plus one batch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from ..events import Event
from ..lineage import CHAIN_KEY, Coordinates, coordinates, is_newer, own_path, record
from ..policies import state_key
from ..processing.aggregating.aggregation import Aggregation
from ..processing.aggregating.folds import (
    check_fresh_state,
    check_output,
    output_event,
    returned_value,
)
from ..processing.handlers import functions_for, has_functions
from ..processing.tables.states import (  # the local engine's: same stored text
    Entry,
    encode,
    encode_dropped_by,
    encode_state,
)
from .source import FIELDS, SCHEMA

try:  # several times faster than the stdlib; exact where used (see decoded_data)
    import orjson
except ImportError:  # pragma: no cover - orjson comes with the spark extra
    orjson = None  # type: ignore[assignment]

KEYED_SCHEMA = SCHEMA + ", key string"
STATE_SCHEMA = (
    "kind string, name string, key string, value string, offsets string, dropped long, "
    "position long, path string, data string, dropped_by string"
)
STATE_NAMES = STATE_SCHEMA.replace(",", "").split()[::2]


@dataclass
class FoldSpec:
    """What executors need of an aggregation (or a downstream stage): functions and names only,
    so it pickles without the App and its connections."""

    name: str
    key: Callable[[Any], Any]
    initial: Callable[[], Any]
    by_type: dict[str, list[Callable[..., Any]]]
    any: list[Callable[..., Any]]
    source: str
    stages: list[FoldSpec] = field(default_factory=list)
    key_field: str | None = None  # a data property: Spark extracts the key without Python

    def handles(self, event_type: str) -> bool:
        return has_functions(self.by_type, self.any, event_type)

    def folds(self, event_type: str) -> list[Callable[..., Any]]:
        return functions_for(self.by_type, self.any, event_type)


def spec_of(agg: Aggregation, source: str) -> FoldSpec:
    if not agg.stages:  # as the local engine refuses it when it starts
        check_fresh_state("aggregation", agg.name, agg.initial_state)
    stages = [
        FoldSpec(s.name, s.key, s.initial, dict(s.folds.by_type), list(s.folds.any), source)
        for s in agg.stages
    ]
    key: Callable[[Any], Any] = agg.key
    return FoldSpec(agg.name, key, agg.initial_state, dict(agg.folds.by_type),
                    list(agg.folds.any), source, stages, agg.key_field)  # fmt: skip


def _rows(batch: Any) -> Iterator[tuple[Any, ...]]:
    return zip(*_columns(batch), strict=True)


def _event_rows(batch: Any) -> Iterator[tuple[Any, ...]]:
    """Rows of ``FIELDS`` (+ key), ``data`` decoded where that is exact and cheap."""
    columns = _columns(batch)
    columns[4] = decoded_data(batch.column(4), columns[4])
    return zip(*columns, strict=True)


def _columns(batch: Any) -> list[list[Any]]:
    return [batch.column(i).to_pylist() for i in range(batch.num_columns)]


def decoded_data(array: Any, texts: list[Any]) -> list[Any]:
    """The data of a batch's events decoded in one go: the dict ``Event.data`` would give, or
    the text where decoding may not be exact or fails (``Event`` then decodes it when asked,
    raising ``CorruptEventError`` as always). orjson reads integers beyond 64 bits as floats:
    text with a run of 19 digits keeps the stdlib (found by Arrow, not per row)."""
    if orjson is None or not texts:
        return texts
    import pyarrow.compute as pc

    loads = orjson.loads
    if array.null_count == 0 and not pc.any(pc.match_substring_regex(array, "[0-9]{19}")).as_py():
        try:
            out = [loads(t) for t in texts]
        except ValueError:
            pass
        else:
            if all(v.__class__ is dict for v in out):
                return out
    out = list(texts)
    long = pc.match_substring_regex(array, "[0-9]{19}").to_pylist()
    for i, text in enumerate(texts):
        if text and long[i] is False:
            try:
                value = loads(text)
            except ValueError:
                continue
            if value.__class__ is dict:
                out[i] = value
    return out


def add_keys(spec: FoldSpec, batches: Iterator[Any]) -> Iterator[Any]:
    """Keep the events the aggregation folds and add their key (the user's key function)."""
    import pyarrow as pa

    what = f"aggregation {spec.name!r}"
    for batch in batches:
        rows = []
        for row in _rows(batch):
            if spec.handles(row[3]):
                event = Event(*row)
                rows.append((*row, state_key(spec.key(event), what, event)))
        if rows:
            cols = list(zip(*rows, strict=True))
            yield pa.RecordBatch.from_arrays([pa.array(c) for c in cols], names=[*FIELDS, "key"])


def fold_sorted(
    spec: FoldSpec,
    batches: Iterator[Any],
    load: Callable[[list[str]], dict[str, Entry]] | None = None,
) -> Iterator[Any]:
    """Fold rows sorted by (key, position); emit each key's state, and outputs for stages.

    ``load``: states stored so far (continuous mode folds a micro-batch onto them).

    Fast path: an event without a source chain is its own root, ``(store, "", (position,))``;
    those are deduplicated against a per-key local and recorded in the offsets once per key.
    Chained events take the general :mod:`eventlanes.lineage` path (the local is written back
    first)."""
    out: list[tuple[Any, ...]] = []
    rows, stored = _with_stored(chain.from_iterable(map(_event_rows, batches)), load)
    source, name = spec.source, spec.name
    folds_of: dict[str, list[Callable[..., Any]]] = {}
    current: str | None = None
    entry = Entry(None)
    last: tuple[int, ...] | None = None  # the store's own path folded last for this key
    dirty = False  # ``last`` is ahead of entry.offsets

    stages = bool(spec.stages)
    # The dedupe of aggregating.dedupe (own roots against a local, chains by lineage), inlined
    # here per key: a call per event would slow this loop, Spark's hottest.
    for pos, stream_id, version, type_, data, meta, recorded_at, rhash, key in rows:
        if key != current:
            if current is not None:
                out.append(_state_of(name, current, entry, source, last if dirty else None))
                if len(out) >= 5000:
                    yield _flushed(out)
            current = key
            entry = stored.get(key) or Entry(spec.initial())
            last, dirty = own_path(entry.offsets, source), False
        if meta is None or meta == "{}" or CHAIN_KEY not in meta:
            path = (pos,)
            if last is not None and path <= last:
                entry.drop(source)
                continue
            last, dirty = path, True
            event = Event(pos, stream_id, version, type_, data, meta, recorded_at, rhash)
            coords: Coordinates | None = None  # (source, "", path), built only for stages
        else:
            if dirty:
                record(entry.offsets, (source, "", last))  # type: ignore[arg-type]
                dirty = False
            event = Event(pos, stream_id, version, type_, data, meta, recorded_at, rhash)
            coords = coordinates(event, source)
            if not is_newer(entry.offsets, coords):
                entry.drop(coords[0])
                continue
            record(entry.offsets, coords)
            last = own_path(entry.offsets, source)
        folds = folds_of.get(type_)
        if folds is None:
            folds = folds_of[type_] = spec.folds(type_)
        made = 0  # outputs of this input so far: each fold's numbered after them
        for fold in folds:
            produced = fold(entry.value, event)
            if produced is not None and stages:
                made += _emit(spec, key, event, coords or (source, "", (pos,)), produced, out,
                              made)  # fmt: skip
                if len(out) >= 5000:
                    yield _flushed(out)
            elif produced is not None and produced is not entry.value:
                returned_value(name, key, event, fold, produced)  # as the local engine
    if current is not None:
        out.append(_state_of(name, current, entry, source, last if dirty else None))
    if out:
        yield _flushed(out)


def _with_stored(
    rows: Iterator[tuple[Any, ...]], load: Callable[[list[str]], dict[str, Entry]] | None
) -> tuple[Iterator[tuple[Any, ...]], dict[str, Entry]]:
    """The rows, and the states stored so far of their keys (none without ``load``)."""
    if load is None:
        return rows, {}
    materialised = list(rows)  # a micro-batch is small: read all, then load its keys in one go
    return iter(materialised), load(sorted({r[8] for r in materialised}))


def _state_of(
    name: str, key: str, entry: Entry, source: str, unrecorded: tuple[int, ...] | None
) -> tuple[Any, ...]:
    """A key's state row, once its own path folded last (``unrecorded``: not yet in the
    offsets) is recorded."""
    if unrecorded is not None:
        record(entry.offsets, (source, "", unrecorded))
    return _state_row(name, key, entry)


def _flushed(out: list[tuple[Any, ...]]) -> Any:
    """The rows of ``out`` as a batch; ``out`` emptied."""
    batch = state_batch(out)
    out.clear()
    return batch


def _emit(
    spec: FoldSpec,
    key: str,
    event: Event,
    coords: Coordinates,
    produced: Any,
    out: list[tuple[Any, ...]],
    made: int = 0,
) -> int:
    """Rows for the downstream stages: one per output and stage, routed by its key there,
    numbered from ``made`` (the input's outputs before these); how many outputs."""
    outs = produced if isinstance(produced, list) else [produced]
    source = f"{spec.name}:{key}"
    for i, o in enumerate(outs, start=made):
        check_output(spec.name, key, event, i, o)  # refused as the local engine refuses it
        path = (*coords[2], i)
        out_event = output_event(o, event.position, source, path)
        raw = json.dumps({"type": o.type, "data": o.data, "metadata": o.metadata})
        for stage in spec.stages:
            to = state_key(stage.key(out_event), f"stage {stage.name!r}", event)
            out.append(("out", stage.name, to, None, source, 0, event.position,
                        json.dumps(path), raw, None))  # fmt: skip
    return len(outs)


_STATE_TYPES = ("string", "string", "string", "string", "string", "int64", "int64", "string",
                "string", "string")  # fmt: skip


def state_batch(rows: list[tuple[Any, ...]]) -> Any:
    """Rows of ``STATE_SCHEMA`` as an Arrow batch (declared types: inference costs 3x)."""
    import pyarrow as pa

    cols = zip(*rows, strict=True)
    arrays = [pa.array(c, type=getattr(pa, t)()) for c, t in zip(cols, _STATE_TYPES, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, names=STATE_NAMES)


def _state_row(name: str, key: str, entry: Entry) -> tuple[Any, ...]:
    return ("state", name, key, encode_state(name, key, entry.value), encode(entry.offsets),
            entry.dropped, None, None, None, encode_dropped_by(entry.dropped_by))  # fmt: skip


def fold_stage(
    stage: FoldSpec, batches: Iterator[Any], load: Callable[[list[str]], dict[str, Entry]] | None
) -> Iterator[Any]:
    """Fold one stage's output rows (downstream key in ``key``, upstream source in
    ``offsets``), sorted by (key, position, path)."""

    from ..events import NewEvent

    rows = sorted(
        (r for b in batches for r in _rows(b)), key=lambda r: (r[2], r[6], json.loads(r[7]))
    )  # numeric path order: the JSON text would sort [10] before [9]
    stored = load(sorted({r[2] for r in rows})) if load else {}
    entries: dict[str, Entry] = {}
    for _kind, _name, key, _value, source, _dropped, position, path, data, _by in rows:
        entry = entries.get(key)
        if entry is None:
            entry = entries[key] = stored.get(key) or Entry(stage.initial())
        coords = (source, "", tuple(json.loads(path)))
        if not is_newer(entry.offsets, coords):
            entry.drop(source)
            continue
        raw = json.loads(data)
        event = output_event(NewEvent(raw["type"], raw["data"], raw["metadata"]), position,
                             source, coords[2])  # fmt: skip
        for fold in stage.folds(event.type):
            produced = fold(entry.value, event)
            if produced is not None and produced is not entry.value:
                returned_value(stage.name, key, event, fold, produced)  # as the local engine
        record(entry.offsets, coords)
    rows_out = [_state_row(stage.name, k, e) for k, e in entries.items()]
    if rows_out:
        yield state_batch(rows_out)
