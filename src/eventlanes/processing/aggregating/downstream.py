"""Outputs folded into downstream stages, one rule for every engine (the local executors,
a windowed Spark replay's driver): each stage's outputs keyed by the stage, a repeat of an
output the stage's key already holds dropped by its chain, the others folded in order."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...events import Event, NewEvent, recorded_raw
from ...lineage import Coordinates, is_newer, record
from ...policies import state_key
from ..tables.states import Entry
from .aggregation import Stage
from .folds import output_event, returned_value

#: an output for a stage: (stage, its coordinates, the output, the input that produced it)
Output = tuple[Stage, Coordinates, NewEvent, Event]
#: an output keyed by its stage: (key, coordinates, output, input)
Keyed = tuple[str, Coordinates, NewEvent, Event]


def by_stage(pending: Iterable[Output]) -> list[tuple[Stage, list[Keyed]]]:
    """The outputs of each stage (in the order they came), keyed by the stage's key."""
    grouped: dict[str, list[Output]] = {}
    for item in pending:
        grouped.setdefault(item[0].name, []).append(item)
    found = []
    for name, items in grouped.items():
        stage = items[0][0]
        keyed = [(state_key(stage.key(out), f"stage {name!r}", src), coords, out, src)
                 for _, coords, out, src in items]  # fmt: skip
        found.append((stage, keyed))
    return found


def fold_downstream(stage: Stage, keyed: list[Keyed], entries: dict[str, Entry]) -> dict[str, Any]:
    """Fold ``keyed`` outputs into the stage's ``entries`` (a missing key starts from the
    stage's initial state); a repeat is dropped and counted. The coordinates of the newest
    output folded into each key."""
    newest: dict[str, Coordinates] = {}
    for key, coords, out, src in keyed:
        entry = entries.get(key)
        if entry is None:
            entry = entries[key] = Entry(stage.initial())
        if not is_newer(entry.offsets, coords):
            entry.drop(coords[0])
            continue
        event = output_event(out, src.position, coords[0], coords[2], recorded_raw(src))
        value = entry.value
        for fold in stage.folds.for_type(event.type):
            if (produced := fold(value, event)) is not None and produced is not value:
                returned_value(stage.name, key, event, fold, produced)  # no stages here
        record(entry.offsets, coords)
        newest[key] = coords
    return newest
