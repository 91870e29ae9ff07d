"""States published to a downstream sink (a Kafka topic) with their source chains."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from ...errors import InvalidInputError
from ...lineage import Coordinates, coordinates_chain, newest_chain, state_chain
from ..tables.states import Entry, decode


def sink_of(name: str, publish: Any, version: int) -> Any:
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


def publish_states(
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
        records.append(_record(name, key, entry.value, chain))
    sink.publish(records)


def publish_stored(
    sink: Any,
    name: str,
    rows: Iterable[tuple[str, str, str]],
    stage: bool = False,
    before: dict[str, Entry] | None = None,
) -> int:
    """Publish states as stored, ``(key, value JSON, offsets JSON)`` (a Spark run's, which
    has no entries in hand), as :func:`publish_states` publishes them, so that a consumer
    drops a state it already had: an aggregation's with the chain of its offsets, a
    downstream ``stage``'s with the newest input this write folded into it (as the local
    engine's write does): of the sources whose coordinates moved since ``before`` (the
    stored entries, None: nothing stored). A stage's sources are upstream keys whose paths
    need not be comparable (a Kafka offset of one partition, of another), so the newest of
    all could be one this write did not move, and a consumer would drop the new state as a
    repeat. How many were published."""
    records = []
    for key, value, text in rows:
        offsets = decode(text)
        if stage:
            held = before.get(key) if before is not None else None
            old = held.offsets if held is not None else {}
            moved = {s: c for s, c in offsets.items() if old.get(s) != c}
            chain = newest_chain(name, moved or offsets)
        else:
            chain = state_chain(name, offsets)
        records.append(_record(name, key, decode(value), chain))
    if records:
        sink.publish(records)
    return len(records)


def _record(name: str, key: str, value: Any, chain: Any) -> tuple[Any, ...]:
    return key, value, chain, [("type", b"AggregateState"), ("aggregation", name.encode())]
