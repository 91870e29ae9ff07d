"""Aggregation folds on Arrow batches: the same key, dedupe and fold code as the local engine.

Spark gives each task an iterator of Arrow record batches; rows are turned into events a batch
at a time (columns to lists, no per-row Spark call), folded in key order, and one row per key is
emitted. Memory per task is one key's state plus one batch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..events import Event
from ..processing.aggregation import Aggregation, Entry
from ..processing.chains import CHAIN_KEY, coordinates, is_newer, record
from .source import FIELDS, SCHEMA

KEYED_SCHEMA = SCHEMA + ", key string"
STATE_SCHEMA = (
    "kind string, name string, key string, value string, offsets string, dropped long, "
    "position long, path string, data string"
)


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
        return bool(self.any) or event_type in self.by_type

    def folds(self, event_type: str) -> list[Callable[..., Any]]:
        return self.by_type.get(event_type, []) + self.any


def spec_of(agg: Aggregation, source: str) -> FoldSpec:
    stages = [
        FoldSpec(s.name, s.key, s.initial, dict(s.folds.by_type), list(s.folds.any), source)
        for s in agg.stages
    ]
    return FoldSpec(agg.name, agg.key, agg.initial_state, dict(agg.folds.by_type),
                    list(agg.folds.any), source, stages, agg.key_field)  # fmt: skip


def _rows(batch: Any) -> Iterator[tuple[Any, ...]]:
    columns = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
    return zip(*columns, strict=True)


def add_keys(spec: FoldSpec, batches: Iterator[Any]) -> Iterator[Any]:
    """Keep the events the aggregation folds and add their key (the user's key function)."""
    import pyarrow as pa

    for batch in batches:
        rows = []
        for row in _rows(batch):
            if spec.handles(row[3]):
                rows.append((*row, str(spec.key(Event(*row)))))
        if rows:
            cols = list(zip(*rows, strict=True))
            yield pa.RecordBatch.from_arrays([pa.array(c) for c in cols], names=[*FIELDS, "key"])


def fold_sorted(
    spec: FoldSpec,
    batches: Iterator[Any],
    load: Callable[[list[str]], dict[str, Entry]] | None = None,
) -> Iterator[Any]:
    """Fold rows sorted by (key, position); emit each key's state, and outputs for stages.

    ``load``: states stored so far (continuous mode folds a micro-batch onto them)."""
    import pyarrow as pa

    names = STATE_SCHEMA.replace(",", "").split()[::2]
    out: list[tuple[Any, ...]] = []

    def flush_rows() -> Any:
        cols = list(zip(*out, strict=True))
        out.clear()
        return pa.RecordBatch.from_arrays([pa.array(c) for c in cols], names=names)

    rows: Iterator[tuple[Any, ...]] = (r for b in batches for r in _rows(b))
    if load is not None:  # a micro-batch is small: read all, then load its keys in one go
        materialised = list(rows)
        stored = load(sorted({r[8] for r in materialised}))
        rows = iter(materialised)
    else:
        stored = {}
    current: str | None = None
    entry: Entry | None = None
    for row in rows:
        key = row[8]
        if key != current:
            if entry is not None and current is not None:
                out.append(_state_row(spec.name, current, entry))
            current = key
            entry = stored.get(key) or Entry(spec.initial())
        assert entry is not None
        event = Event(*row[:8])
        coords = coordinates(event, spec.source)
        if not is_newer(entry.offsets, coords):
            entry.dropped += 1
            continue
        for fold in spec.folds(event.type):
            produced = fold(entry.value, event)
            if produced is not None and spec.stages:
                outs = produced if isinstance(produced, list) else [produced]
                source = f"{spec.name}:{key}"
                for i, o in enumerate(outs):
                    path = (*coords[2], i)
                    out_event = output_event(o, event.position, source, path)
                    for stage in spec.stages:
                        out.append(("out", stage.name, str(stage.key(out_event)), None, source,
                                    0, event.position, json.dumps(path),
                                    json.dumps({"type": o.type, "data": o.data,
                                                "metadata": o.metadata})))  # fmt: skip
        record(entry.offsets, coords)
        if len(out) >= 5000:
            yield flush_rows()
    if entry is not None and current is not None:
        out.append(_state_row(spec.name, current, entry))
    if out:
        yield flush_rows()


def _state_row(name: str, key: str, entry: Entry) -> tuple[Any, ...]:
    return ("state", name, key, json.dumps(entry.value), json.dumps(entry.offsets),
            entry.dropped, None, None, None)  # fmt: skip


def output_event(out: Any, position: int, source: str, path: tuple[int, ...]) -> Event:
    """A fold output as the event a downstream stage folds (as the local engine builds it)."""
    meta = {**out.metadata, CHAIN_KEY: [{"source": source, "partition": "", "offset": path[0]}]}
    return Event(position, source, 0, out.type, out.data, meta, 0, 0, source)


def fold_stage(
    stage: FoldSpec, batches: Iterator[Any], load: Callable[[list[str]], dict[str, Entry]] | None
) -> Iterator[Any]:
    """Fold one stage's output rows (downstream key in ``key``, upstream source in
    ``offsets``), sorted by (key, position, path)."""
    import pyarrow as pa

    from ..events import NewEvent

    names = STATE_SCHEMA.replace(",", "").split()[::2]
    rows = sorted(
        (r for b in batches for r in _rows(b)), key=lambda r: (r[2], r[6], json.loads(r[7]))
    )  # numeric path order: the JSON text would sort [10] before [9]
    stored = load(sorted({r[2] for r in rows})) if load else {}
    entries: dict[str, Entry] = {}
    for _kind, _name, key, _value, source, _dropped, position, path, data in rows:
        entry = entries.get(key)
        if entry is None:
            entry = entries[key] = stored.get(key) or Entry(stage.initial())
        coords = (source, "", tuple(json.loads(path)))
        if not is_newer(entry.offsets, coords):
            entry.dropped += 1
            continue
        raw = json.loads(data)
        event = output_event(NewEvent(raw["type"], raw["data"], raw["metadata"]), position,
                             source, coords[2])  # fmt: skip
        for fold in stage.folds(event.type):
            fold(entry.value, event)
        record(entry.offsets, coords)
    rows_out = [_state_row(stage.name, k, e) for k, e in entries.items()]
    if rows_out:
        cols = list(zip(*rows_out, strict=True))
        yield pa.RecordBatch.from_arrays([pa.array(c) for c in cols], names=names)
